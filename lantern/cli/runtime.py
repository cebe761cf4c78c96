"""``lantern runtime ...``: the microVM tier's drivers, runtime nodes and VMs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lantern.cli.common import console, run
from lantern.observability.logs import FORMATS, LogFormat

if TYPE_CHECKING:
    from lantern.runtime.drivers import Check


@click.group()
def runtime() -> None:
    """The microVM tier: drivers, runtime nodes and their VMs."""


def image_dir() -> Path:
    """Where build-image writes the qemu driver's image, and where the driver reads it."""
    from lantern.cli.common import settings

    return settings(click.get_current_context()).data_path / "runtime"


@runtime.command("build-image")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None)
def build_image(out: Path | None) -> None:
    """Build the kernel and initramfs the qemu driver boots, from this host's packages."""
    from lantern.cli.common import fail
    from lantern.runtime.image import ImageError, build

    target = out or image_dir()
    try:
        vmlinux, initramfs = build(target)
    except (ImageError, OSError) as exc:
        fail(str(exc), 1)
    click.echo(f"{vmlinux} ({vmlinux.stat().st_size // 1024} KiB)")
    click.echo(f"{initramfs} ({initramfs.stat().st_size // 1024} KiB)")


@runtime.command("check")
def check() -> None:
    """Which drivers work on this host, and why the others don't (exit 0 when one works)."""
    from lantern.runtime.drivers import check as check_drivers
    from lantern.runtime.drivers import use_image

    use_image(image_dir())

    async def body() -> int:
        found = await check_drivers()
        from rich.table import Table

        table = Table("driver", "works", "isolation", "why", "seconds")
        for c in found:
            table.add_row(
                c.driver, "yes" if c.works else "no", c.isolation, c.why, f"{c.seconds:.2f}"
            )
        console().print(table)
        click.echo(auto_choice(found))
        if any(c.works for c in found):
            return 0
        click.echo("error: no driver works on this host", err=True)
        return 1

    sys.exit(run(body))


def auto_choice(found: list[Check]) -> str:
    """What ``auto`` picks and why: qemu before gVisor before sandbox, the first that works."""
    from lantern.runtime.drivers import DRIVERS

    ranked = sorted(found, key=lambda c: -DRIVERS[c.driver].strength)
    skipped: list[str] = []
    for c in ranked:
        if c.works:
            why = "; ".join(skipped)
            return f"auto: {c.driver}" + (
                f" (stronger ones do not work here: {why})" if why else ""
            )
        skipped.append(f"{c.driver}: {c.why}")
    return "auto: none (no driver works on this host)"


@runtime.command("nodes")
def nodes() -> None:
    """The runtime nodes, their drivers, capacity and heartbeats."""
    from lantern.cli.common import opened, remote, settings
    from lantern.runtime.views import node_json

    s = settings(click.get_current_context())

    async def body() -> None:
        api = remote()  # with LANTERN_URL, that server's nodes (an operator key)
        if api is not None:
            async with api:
                found = await api.runtime_nodes()
        else:
            async with opened(s) as store:
                found = [node_json(n, s.node_ttl) for n in await store.list_nodes()]
        from rich.table import Table

        table = Table("node", "driver", "state", "running", "capacity", "labels", "heartbeat")
        for n in found:
            labels = ",".join(f"{k}={v}" for k, v in n["labels"].items())
            table.add_row(
                n["nodeId"], n["driver"], n["state"], str(n["running"]), str(n["capacity"]),
                labels, n["heartbeatAt"],
            )  # fmt: skip
        console().print(table)

    run(body)


@runtime.command("vms")
@click.argument("run_id", required=False)
def vms(run_id: str | None) -> None:
    """VMs, newest first (or RUN_ID's, oldest first): node, driver, state and why it ended."""
    from lantern.cli.common import opened, remote, settings
    from lantern.errors import UsageError
    from lantern.runtime.views import vm_json

    s = settings(click.get_current_context())

    async def body() -> None:
        found: list[dict[str, Any]]
        api = remote()  # with LANTERN_URL, one run's VMs from that server
        if api is not None:
            if not run_id:
                raise UsageError(
                    "through LANTERN_URL, runtime vms needs a RUN_ID (the API lists one"
                    " run's VMs); unset LANTERN_URL to list every VM in the database"
                )
            async with api:
                found = await api.vms(run_id)
        else:
            async with opened(s) as store:
                vms = await store.run_vms(run_id) if run_id else await store.list_vms()
            found = [vm_json(v) for v in vms]
        from rich.table import Table

        table = Table("vm", "run", "attempt", "node", "driver", "state", "reason", "exit")
        for v in found:
            table.add_row(
                v["vmId"], v["runId"], str(v["attempt"]), v["nodeId"], v["driver"], v["state"],
                v["reason"] or "", "" if v["exitCode"] is None else str(v["exitCode"]),
            )  # fmt: skip
        console().print(table)

    run(body)


@click.command("node")
@click.option(
    "--driver", default=None, help="qemu, gvisor, sandbox or auto (LANTERN_RUNTIME_DRIVER)."
)
@click.option("--capacity", type=click.IntRange(1, 1024), default=4, help="VMs at once.")
@click.option("--memory-mb", type=click.IntRange(64), default=4096, help="Memory of all its VMs.")
@click.option("--labels", default="", help="k=v,... shown with the node.")
@click.option(
    "--app",
    "app_dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    required=True,
    help="The app directory VMs import entrypoints from (read-only); never the node's data.",
)
@click.option("--node-id", default=None, help="Default: host name and process id.")
@click.option(
    "--warm",
    type=click.IntRange(0, 64),
    default=None,
    help="VMs kept booted for the next placements (default: 1 for qemu, 0 otherwise).",
)
@click.option(
    "--warm-memory-mb",
    type=click.IntRange(64, 65536),
    default=512,
    help="The memory of warm VMs until a placement asks for another size (default 512).",
)
@click.option(
    "--log-format",
    type=click.Choice(FORMATS),
    envvar="LANTERN_LOG_FORMAT",
    default="text",
    show_default=True,
    help="text for people, json (one object per line) for collectors; LANTERN_LOG_FORMAT.",
)
def node(
    driver: str | None,
    capacity: int,
    memory_mb: int,
    labels: str,
    app_dir: Path,
    node_id: str | None,
    warm: int | None,
    warm_memory_mb: int,
    log_format: LogFormat,
) -> None:
    """A runtime node of the microVM tier: registers, heartbeats, runs the VMs placed on it."""
    import asyncio
    import logging
    import os
    import signal
    import socket

    from lantern.cli.appdir import shares_private
    from lantern.cli.common import fail, opened, settings
    from lantern.observability import logs
    from lantern.runtime.drivers import DriverUnavailable, pick, use_image
    from lantern.runtime.node import Node

    use_image(image_dir())
    s = settings(click.get_current_context())
    logs.configure(log_format)  # the node's own lines (a warm VM ready, a VM refused) at INFO
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per relayed report
    found: dict[str, str] = {}
    for pair in filter(None, labels.split(",")):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--labels wants k=v pairs, not {pair!r}", 2)
        found[key] = value
    control = os.environ.get("LANTERN_URL")
    if not control:
        fail("lantern node needs LANTERN_URL: the control plane it relays reports to", 2)
    name = driver or s.runtime_driver
    app_path = app_dir.resolve()
    private = shares_private(app_dir, s.data_path, s.database_url)
    if private is not None:
        fail(private, 2)

    async def body() -> None:
        try:
            chosen, _ = await pick(name)
        except DriverUnavailable as exc:
            fail(str(exc), 2)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        async with opened(s) as store:
            runtime_node = Node(
                store,
                chosen,
                node_id=node_id or f"{socket.gethostname()}:node-{os.getpid()}",
                control_url=str(control),
                app_dir=app_path,
                capacity=capacity,
                memory_mb=memory_mb,
                labels=found,
                node_ttl=s.node_ttl,
                lease_ttl=s.lease_ttl,
                warm=chosen.warm if warm is None else warm,
                warm_memory_mb=warm_memory_mb,
                log_bytes=s.vm_log_bytes,
            )
            click.echo(f"runtime node {runtime_node.node_id}: driver {chosen.name}", err=True)
            await runtime_node.serve(stopping)

    run(body)
