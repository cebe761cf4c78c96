"""Numbered migrations and the reference schema, read from the package's ``sql/`` folder."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Literal

Backend = Literal["sqlite", "postgres"]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(backend: Backend) -> list[Migration]:
    folder = resources.files("lantern.store") / "sql" / backend / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number, _, rest = entry.name.partition("_")
            found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def schema(backend: Backend) -> str:
    return (resources.files("lantern.store") / "sql" / backend / "schema.sql").read_text()
