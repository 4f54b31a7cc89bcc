"""Every `.md` file the project names (in its docs, README, code, help texts) exists: a doc
that was renamed or never written is a dead end for the reader."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_NAMED = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b")
# Files named in text that are another project's, not ours.
_ELSEWHERE = {"CHANGELOG.md", "writing_exporters.md", "naming.md"}
# The steering repo's reference notes, laid beside the clone (../shared/reference/).
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"


def _sources() -> list[Path]:
    found = [ROOT / "README.md"]
    for folder in ("docs", "memforensics", "benchmarks", "deploy", "fixtures", "scripts"):
        found += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".md", ".py", ".c")]
    return found


def _exists(name: str, where: Path) -> bool:
    bases = (ROOT, ROOT / "docs", where.parent, SHARED_REFERENCE)
    return any((base / name).is_file() for base in bases)


def test_every_named_markdown_file_exists() -> None:
    missing = []
    for path in _sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        # another project's file, quoted with its repository (owner/name `path.md`)
        text = re.sub(r"[\w.-]+/[\w.-]+ `[^`]+`", "", text)
        for name in _NAMED.findall(text):
            if Path(name).name in _ELSEWHERE:
                continue
            if not _exists(name, path):
                missing.append(f"{path.relative_to(ROOT)} names {name}")
    assert missing == []


def test_the_checker_sees_a_missing_file(tmp_path: Path) -> None:
    assert _NAMED.findall("see docs/nothing-here.md and README.md.") == [
        "docs/nothing-here.md",
        "README.md",
    ]
    assert not _exists("docs/nothing-here.md", tmp_path / "x.md")
