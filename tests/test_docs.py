"""The code in docs/adding-a-backend.md works as written."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

import backends
from tests.conftest import REPO


def test_the_adding_a_backend_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = (REPO / "docs" / "adding-a-backend.md").read_text()
    module_code, registry, test_code = re.findall(r"```python\n(.*?)```", doc, re.S)
    module = types.ModuleType("backends.aider")
    exec(compile(module_code, "backends/aider.py", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "backends.aider", module)
    # The registry line, as a reader would add it to backends/__init__.py.
    (line,) = re.findall(r'^\s*"aider": (.*),$', registry, re.M)
    monkeypatch.setitem(backends.BUILTIN, "aider", eval(line, vars(backends)))
    namespace: dict[str, object] = {}
    exec(compile(test_code, "tests/test_aider.py", "exec"), namespace)
    test = namespace["test_command_line_and_environment"]
    assert callable(test)
    test(tmp_path)
