"""The dependency direction, read from the source: the core sits under its two faces and the
backends, the server never imports a backend, and the reaper needs only the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# The command line wires the core to the backends and the server: it is the one part of
# runagent/ that may import them. `python -m runagent` is the command line too.
CLI = ("runagent/cli.py", "runagent/cli/", "runagent/__main__.py")
CORE = sorted(
    p for p in (REPO / "runagent").rglob("*.py") if not str(p.relative_to(REPO)).startswith(CLI)
)


def imports(path: Path, root: Path = REPO) -> set[str]:
    """Every module `path` imports, at its top or inside a function; `from a import b` counts
    as importing both `a` and `a.b` (b may be a module)."""
    package = path.relative_to(root).parent.parts
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else ()
            base = ".".join([*anchor, node.module] if node.module else anchor)
            found.update([base] if base else [])
            found.update(f"{base}.{a.name}" if base else a.name for a in node.names)
    return found


def under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_core_list_is_not_empty() -> None:
    names = {p.name for p in CORE}
    assert {"supervisor.py", "config.py", "backend.py"} <= names and "cli.py" not in names


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(REPO)))
def test_the_core_imports_no_face_and_no_backend(path: Path) -> None:
    upward = {m for m in imports(path) if under(m, "runagent.cli", "server", "backends")}
    assert not upward, f"{path.relative_to(REPO)} imports {sorted(upward)}"


def test_the_server_imports_no_backend() -> None:
    for path in sorted((REPO / "server").rglob("*.py")):
        found = {m for m in imports(path) if under(m, "backends", "runagent.cli")}
        assert not found, f"{path.relative_to(REPO)} imports {sorted(found)}"


def test_the_reaper_imports_only_the_standard_library() -> None:
    # It is the one process between a supervisor and its agent, started with `python -I -S`.
    found = imports(REPO / "runagent" / "reaper.py")
    foreign = {m for m in found if m.split(".")[0] not in sys.stdlib_module_names}
    assert found and not foreign, sorted(foreign)


def test_the_checks_see_relative_imports_and_imports_inside_functions(tmp_path: Path) -> None:
    (tmp_path / "runagent").mkdir()
    probe = tmp_path / "runagent" / "probe.py"
    probe.write_text(
        "from . import cli\n\ndef f():\n    from .. import backends\n    import server.app\n"
    )
    assert {"runagent.cli", "backends", "server.app"} <= imports(probe, tmp_path)
