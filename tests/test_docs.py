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
    paths += [
        *(ROOT / "tools").glob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
        *(ROOT / "upstream").glob("*"),
    ]
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in paths
        if path.is_file() and path.name != "test_docs.py"
        for match in ISSUE_NUMBER.finditer(path.read_text(errors="replace"))
    ]
    assert found == []
