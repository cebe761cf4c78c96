"""The agent `runtime` block: validated with every problem at once, nothing stored."""

from __future__ import annotations

import pytest

from lantern.engine.graph import parse_agent
from lantern.engine.microvm import MicroVmAgent
from lantern.errors import DefinitionError


def test_a_valid_block_gives_its_settings_and_the_defaults() -> None:
    agent = parse_agent(
        {"name": "scrape", "runtime": {"tier": "microvm", "entrypoint": "jobs:scrape"}}
    )
    assert agent == MicroVmAgent("scrape", "jobs:scrape", "auto", 512, 1, 900, "none")


def test_every_problem_is_named_at_once() -> None:
    block = {
        "tier": "shared",
        "entrypoint": "jobs",
        "driver": "firecracker",
        "memoryMb": 10**7,
        "vcpus": 0,
        "timeoutS": "soon",
        "network": ["example.com"],
        "gpu": True,
    }
    with pytest.raises(DefinitionError) as caught:
        parse_agent({"name": "bad", "runtime": block, "graph": {"nodes": [], "edges": []}})
    problems = caught.value.problems
    for expected in (
        "no 'graph'",
        "runtime.gpu is not a runtime setting",
        "runtime.tier must be 'microvm'",
        "runtime.entrypoint must be MODULE:FUNCTION",
        "runtime.driver 'firecracker' is unknown: use one of auto, qemu, gvisor, sandbox",
        "runtime.memoryMb must be an integer from 64 to 65536",
        "runtime.vcpus must be an integer from 1 to 64",
        "runtime.timeoutS must be an integer from 1 to 86400",
        "runtime.network must be 'none'",
    ):
        assert any(expected in p for p in problems), (expected, problems)
    assert len(problems) == 9


@pytest.mark.parametrize("block", [None, [], "microvm"])
def test_a_block_that_is_no_object_is_refused(block: object) -> None:
    with pytest.raises(DefinitionError, match="runtime must be an object"):
        parse_agent({"name": "bad", "runtime": block})
