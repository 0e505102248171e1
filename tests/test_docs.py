"""The docs name tests that exist and carry no project-internal issue numbers."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
TEST_REFERENCE = re.compile(r"`(?:tests/)?(test_\w+\.py)(?:::(test_\w+))?")
ISSUE_NUMBER = re.compile(r"\bissues? \d+(\.\d+)?\b", re.IGNORECASE)


def _tests_defined() -> dict[str, set[str]]:
    defined: dict[str, set[str]] = {}
    for path in (ROOT / "tests").glob("test_*.py"):
        defined[path.name] = set(re.findall(r"^(?:    )?def (test_\w+)", path.read_text(), re.MULTILINE))
    return defined


def test_every_test_a_doc_names_exists() -> None:
    defined = _tests_defined()
    missing = []
    for doc in DOCS:
        for file, name in TEST_REFERENCE.findall(doc.read_text()):
            if file not in defined or (name and name not in defined[file]):
                missing.append(f"{doc.relative_to(ROOT)}: {file}{'::' + name if name else ''}")
    assert missing == []


def test_no_project_issue_numbers_in_docs_source_or_tests() -> None:
    paths = [*DOCS, *(ROOT / "vllm_staging_plugin").rglob("*.py"), *(ROOT / "tests").glob("*.py")]
    paths += [p for p in (ROOT / "lab").rglob("*") if p.suffix in (".py", ".sh", ".md", ".txt")]
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in paths
        if path.is_file() and path.name != "test_docs.py"
        for match in ISSUE_NUMBER.finditer(path.read_text(errors="replace"))
    ]
    assert found == []


LINK = re.compile(r"\]\(([^)\s]+)\)")
LINKED = [*DOCS, *(ROOT / "docs" / "data").glob("*/README.md"), *(ROOT / "lab").rglob("*.md")]


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    found, fence = set(), False
    for line in page.read_text().splitlines():
        fence ^= line.startswith("```")
        if not fence and line.startswith("#"):
            found.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return found


def test_every_relative_link_of_the_docs_resolves() -> None:
    broken = []
    for page in LINKED:
        fence = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            fence ^= line.startswith("```")
            for target in [] if fence else LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                linked = (page.parent / path).resolve() if path else page
                if not linked.exists() or (
                    anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
                ):
                    broken.append(f"{page.relative_to(ROOT)}:{number}: {target}")
    assert broken == []
