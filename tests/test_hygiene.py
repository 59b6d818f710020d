"""The repository stands on its own: no file points outside it.

Every tracked text file is checked: no absolute path into the machine the project was written on, and every
mention of one of the specification's file names is a link to a document under docs/ that exists (a bare
spec file name with a section number in code cites something the repository does not contain).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# built from pieces so that this file does not match itself
_OUTSIDE = ("/" + "work/", "shared" + "/spec", ".." + "/shared")
_SPEC_NAMES = ("model-qwen3.6", "flash-next", "artifact", "serving", "upstream-v1", "product", "peers", "hardware",
               "fast-kernels", "style")  # fmt: skip
_MENTION = re.compile(r"([\w./-]*?)\b(" + "|".join(map(re.escape, _SPEC_NAMES)) + r")\.md\b")


def _tracked() -> list[Path]:
    if shutil.which("git") and (REPO / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        return [REPO / p for p in out.decode().split("\0") if p]
    skip = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache"}
    return [p for p in REPO.rglob("*") if p.is_file() and not skip.intersection(p.relative_to(REPO).parts)]


def _texts() -> list[tuple[str, str]]:
    out = []
    for p in _tracked():
        if not p.is_file() or p.stat().st_size > 2_000_000:
            continue
        try:
            out.append((p.relative_to(REPO).as_posix(), p.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue  # binary
    return out


def _resolves_into_docs(rel: str, prefix: str, name: str) -> bool:
    """``prefix + name.md`` names an existing document under docs/, read from the repository root or from the
    mentioning file's directory."""
    docs = (REPO / "docs").resolve()
    for base in (REPO, (REPO / rel).parent):
        target = (base / f"{prefix}{name}.md").resolve()
        if target.is_file() and target.is_relative_to(docs):
            return True
    return False


def test_no_file_points_outside_the_repository() -> None:
    bad = [
        f"{rel}:{text.count(chr(10), 0, i) + 1}: {needle}"
        for rel, text in _texts()
        for needle in _OUTSIDE
        for i in [m.start() for m in re.finditer(re.escape(needle), text)]
    ]
    assert not bad, "paths outside the repository:\n" + "\n".join(bad)


def test_spec_file_names_are_links_into_docs() -> None:
    bad = []
    for rel, text in _texts():
        for m in _MENTION.finditer(text):
            prefix, name = m.group(1), m.group(2)
            if not _resolves_into_docs(rel, prefix, name):
                bad.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    assert not bad, "cite docs/ (the repository's own documents), not the specification:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", ["model-math", "formats", "flash-next", "protocols"])
def test_cited_sections_exist(doc: str) -> None:
    """``docs/<doc>.md §N`` cited anywhere names a section (or a numbered step like §4.6) the document has."""
    body = (REPO / "docs" / f"{doc}.md").read_text(encoding="utf-8")
    cited = {
        m.group(1) for _, text in _texts() for m in re.finditer(rf"docs/{doc}\.md §(\d+(?:\.\d+)?)", text)
    }
    assert cited, f"nothing cites docs/{doc}.md"
    missing = sorted(s for s in cited if f"§{s}" not in body)
    assert not missing, f"docs/{doc}.md has no section {missing}"
