"""The type checker's escape hatch stays narrow: every `# type: ignore` in src/hutch names its error
code and says why on the same line (`# type: ignore[code]  # reason`). mypy (`make typecheck`) fails
on an ignore that suppresses nothing; this test fails on one that does not say what it suppresses and why."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "hutch"
IGNORE = re.compile(r"#\s*type:\s*ignore")
JUSTIFIED = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,[a-z-]+)*\]  # \S")


def test_every_type_ignore_names_its_code_and_its_reason() -> None:
    bare = [f"{path.relative_to(SRC.parent)}:{n}: {line.strip()}"
            for path in sorted(SRC.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if IGNORE.search(line) and not JUSTIFIED.search(line)]
    assert bare == []
