"""Plain columns for listings: what ``lantern runs list`` and its kin print.

Aligned text with two spaces between columns and a header line, never wrapped or cut, so an id
can be copied from it and a script can split it (``awk``, or on two or more spaces). It needs no
terminal library: rich's import alone was a sixth of a listing's start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import click

GAP = "  "


def columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """The header and rows as aligned lines; the last column is not padded. A cell's runs of
    whitespace (a prompt's newlines) become one space and an empty cell is ``-``, so a row is
    one line and splitting it on two spaces gives every column."""
    lines = [list(header), *([" ".join(cell.split()) or "-" for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        GAP.join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def echo_columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    click.echo(columns(header, rows))
