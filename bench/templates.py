"""What a template can cost under the sandbox's limits (lantern/sandbox.py).

Renders each template bomb the hostile tests use, and a few ordinary templates for scale, and
prints how long each took to render or be refused. The figure to watch is the worst case: a
render runs on the event loop every run shares, so the worst refused bomb is how long one
tenant can hold the loop with one template.

    .venv/bin/python bench/templates.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from lantern.errors import TemplateError
from lantern.nodes.templates import render

BOMBS = {
    "repeat": "{{ 'a' * 200000000 }}",
    "repeat-input": "{{ input.s * input.n }}",
    "power": "{{ 7 ** (9 ** 7) }}",
    "nested-loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}",
    "loop-output": "{% for i in range(99999) %}{% for j in range(99999) %}{{ j }}{% endfor %}"
    "{% endfor %}",
    "center": "{{ 'a'|center(1000000000) }}",
    "format-width": "{{ '{:>999999999}'.format(1) }}",
    "doubling": "{% macro d(x, n) %}{{ d(x ~ x, n - 1) if n else x|length }}{% endmacro %}"
    "{{ d('abcdefghij', 40) }}",
    "list-repeat": "{{ ((range(1000)|list) * 1000)|join(',') }}",
    "recursion": "{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}",
    "replace": "{{ ('a' * 900000)|replace('a', 'bbbbbbbbbb') }}",
}
ORDINARY = {
    "one-value": "{{ input.name }}",
    "sentence": "Dear {{ input.name }}, your order {{ input.order }} ships {{ input.when }}.",
    "loop-100": "{% for i in input.lines %}{{ i.name }}: {{ i.qty }}\n{% endfor %}",
}
CONTEXT = {
    "input": {
        "s": "x",
        "n": 10**9,
        "name": "Ada",
        "order": "o-1",
        "when": "today",
        "lines": [{"name": f"item {i}", "qty": i} for i in range(100)],
    },
    "steps": {},
}


def timed(template: str, repeat: int) -> tuple[float, str]:
    samples = []
    outcome = ""
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            render(template, CONTEXT)
            outcome = "rendered"
        except TemplateError as exc:
            outcome = "refused: " + str(exc).split(": ", 1)[-1][:60]
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    worst = ("", 0.0)
    print(f"{'template':16} {'median ms':>10}  outcome")
    for group in (BOMBS, ORDINARY):
        for name, template in group.items():
            took, outcome = timed(template, args.repeat)
            print(f"{name:16} {took * 1000:10.2f}  {outcome}")
            if group is BOMBS and took > worst[1]:
                worst = (name, took)
    ordinary = max(timed(t, args.repeat)[0] for t in ORDINARY.values())
    print(f"\nworst bomb: {worst[0]} {worst[1] * 1000:.1f} ms")
    print(f"worst bomb / worst ordinary template: {worst[1] / ordinary:.0f}x")


if __name__ == "__main__":
    main()
