"""The llm's packages import downward only: engine/ drives runner/, runner/ never reaches back into engine/, and the
types both read (sequence.py, batch.py, sampling.py) import neither. Read from the sources (every import, lazy
ones inside functions included), so a cycle fails here before it fails at import time."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LLM = Path(__file__).resolve().parents[1] / "services" / "llm"


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def sources(*parts: str) -> list[Path]:
    base = LLM.joinpath(*parts)
    return sorted(base.rglob("*.py")) if base.is_dir() else [base]


@pytest.mark.parametrize("path", sources("runner"), ids=lambda p: str(p.relative_to(LLM)))
def test_the_runner_does_not_import_the_engine(path):
    assert not {m for m in imports(path) if m.startswith("services.llm.engine")}


@pytest.mark.parametrize("name", ["sequence.py", "batch.py", "sampling.py"])
def test_the_shared_types_import_neither_engine_nor_runner(name):
    upward = {m for m in imports(LLM / name) if m.startswith(("services.llm.engine", "services.llm.runner"))}
    assert not upward


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from services.llm.engine.sampler import Sampler\n")
    assert "services.llm.engine.sampler" in imports(lazy)
