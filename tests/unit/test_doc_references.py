"""The README and the docs cite only files the repository has: every relative link, every
`docs/...`, `examples/...`, `bench/...` path and every NAME.md they mention (issue 18: the
README cited documents a newcomer could not find)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted(ROOT.glob("docs/*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)")
PATH = re.compile(r"(?<![\w/.-])((?:docs|examples|bench|lantern)/[\w./-]+\.(?:md|py|json|yaml))")
NAME = re.compile(r"\b([A-Z][A-Z_]+\.md)\b")


def cited(document: Path) -> list[tuple[str, Path]]:
    text = document.read_text()
    found = [
        (m, document.parent / m) for m in LINK.findall(text) if not m.startswith(("http", "mailto"))
    ]
    found += [(m, ROOT / m) for m in PATH.findall(text)]
    found += [(m, ROOT / m) for m in NAME.findall(text) if not (document.parent / m).exists()]
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_cited_file_is_in_the_repository(document: Path) -> None:
    missing = sorted({words for words, path in cited(document) if not path.exists()})
    assert missing == [], f"{document.relative_to(ROOT)} cites {missing}"


def test_the_check_finds_a_missing_document(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("See [the contract](CONTRACT.md) and docs/nowhere.md.")
    assert {w for w, p in cited(readme) if not p.exists()} == {"CONTRACT.md", "docs/nowhere.md"}
