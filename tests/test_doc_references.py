"""Every "SPEC n", "CODEC.md n.k", "contract.md n" and "gguf.md n" cited in the code and the
documents resolves to a section of the repository's own docs/ (the issue found citations of a
specification that was not in the repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SOURCES = ["s2core", "backends", "plugins", "tests", "benchmarks", "docs", "README.md"]
SKIP_PARTS = {".venv", "build", "__pycache__", ".git", "results"}

CITATION = re.compile(r"\b(SPEC|CODEC(?:\.md)?|contract\.md|gguf\.md)(?: section)? "
                      r"(\d+(?:\.\d+)?)\b")
DOC_OF = {"SPEC": "spec.md", "CODEC": "codec.md", "CODEC.md": "codec.md",
          "contract.md": "contract.md", "gguf.md": "gguf.md"}


def _files() -> list[Path]:
    out = []
    for name in SOURCES:
        path = ROOT / name
        if path.is_file():
            out.append(path)
            continue
        out += [p for p in path.rglob("*") if p.suffix in (".py", ".md")
                and not SKIP_PARTS & set(p.relative_to(ROOT).parts)]
    return out


def _sections(doc: str) -> set[str]:
    """Numbered headings ("## 2.", "### 2.1"), and "n.k" for the numbered list items of
    section n (codec.md cites steps that way)."""
    found, current = set(), None
    for line in (DOCS / doc).read_text().splitlines():
        heading = re.match(r"#{2,4} (\d+(?:\.\d+)?)\.? ", line)
        if heading:
            found.add(heading.group(1))
            current = heading.group(1).split(".")[0]
            continue
        item = re.match(r"(\d+)\. ", line)
        if item and current is not None:
            found.add(f"{current}.{item.group(1)}")
    return found


def test_citations_are_found_at_all():
    """The scan sees the citations this test is about (it would pass vacuously otherwise)."""
    cited = {m.group(0) for f in _files() for m in CITATION.finditer(f.read_text(errors="replace"))}
    assert {"SPEC 2.3", "CODEC.md 4"} <= cited


@pytest.mark.parametrize("doc", sorted(set(DOC_OF.values())))
def test_every_citation_resolves_inside_the_repository(doc):
    sections = _sections(doc)
    missing = []
    for f in _files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in CITATION.finditer(line):
                if DOC_OF[m.group(1)] == doc and m.group(2) not in sections:
                    missing.append(f"{f.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not missing, f"citations of docs/{doc} that no section answers:\n" + "\n".join(missing)
