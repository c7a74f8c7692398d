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
    assert {"supervisor.py", "settings.py", "backend.py"} <= names and "cli.py" not in names


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


def module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycle(root: Path = REPO) -> list[str]:
    """One import cycle among the project's modules (its modules in import order, the first
    repeated at the end), or [] when there is none. An import inside a function counts: it
    ties the two modules together as surely as one at the top."""
    paths = [p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))]
    modules = {module_name(p, root): p for p in paths}
    graph = {
        name: sorted(m for m in imports(path, root) if m in modules and m != name)
        for name, path in modules.items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        stack.append(name)
        for target in graph[name]:
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return []


PACKAGES = ("runagent", "server", "backends")


def test_no_module_imports_itself_through_others() -> None:
    cycle = import_cycle()
    assert not cycle, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_finds_a_cycle_and_names_its_modules(tmp_path: Path) -> None:
    (tmp_path / "runagent").mkdir()
    (tmp_path / "server").mkdir()
    (tmp_path / "backends").mkdir()
    (tmp_path / "runagent" / "a.py").write_text("from runagent import b\n")
    (tmp_path / "runagent" / "b.py").write_text("def f():\n    from server.c import x\n")
    (tmp_path / "server" / "c.py").write_text("import runagent.a\n")
    (tmp_path / "server" / "d.py").write_text("import runagent.b\n")
    assert import_cycle(tmp_path) == ["runagent.a", "runagent.b", "server.c", "runagent.a"]
    (tmp_path / "server" / "c.py").write_text("x = 1\n")
    assert import_cycle(tmp_path) == []


# The floors of the project, lowest first: a module imports only from its own floor and those
# below it, at its top, inside a function or for type checking alone (`imports` sees them all).
# A module is on the floor of the longest prefix that names it.
GROUND = (
    "runagent",
    "runagent.errors",
    "runagent.record",
    "runagent.programs",
    "runagent.duration",
)
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", GROUND),  # what every floor stands on
    ("store", ("runagent.store",)),  # the runs root's files
    ("process", ("runagent.process", "runagent.reaper")),  # a process tree, started and killed
    ("tools", ("runagent.ops", "runagent.paste")),  # what an agent acts and talks through
    ("config", ("runagent.config",)),
    ("git", ("runagent.issues",)),  # the repositories and worktrees a loop works in
    ("loop", ("runagent.loop", "runagent.backend")),
    ("fleet", ("runagent.fleet", "runagent.listing", "runagent.schedule", "runagent.crontab")),
    ("executors", ("runagent.executors",)),
    ("service", ("runagent.service", "runagent.doctor", "runagent.race")),
    ("faces", ("runagent.cli", "runagent.__main__", "server", "backends")),
)


def floor_of(module: str) -> int | None:
    """The floor of a module (its index in FLOORS), by the longest prefix that names it."""
    best: tuple[int, int] | None = None  # (prefix length, floor)
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if under(module, prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return best[1] if best is not None else None


def floor_breaches(root: Path = REPO) -> list[str]:
    """Every import that reaches a floor above its module's, as `a (floor) -> b (floor)`."""
    paths = [p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))]
    modules = {module_name(p, root): p for p in paths}
    found = []
    for name, path in modules.items():
        mine = floor_of(name)
        assert mine is not None, f"{name} is on no floor: name it in FLOORS"
        for target in sorted(m for m in imports(path, root) if m in modules):
            theirs = floor_of(target)
            if theirs is not None and theirs > mine:
                found.append(f"{name} ({FLOORS[mine][0]}) -> {target} ({FLOORS[theirs][0]})")
    return found


def test_every_module_imports_only_from_its_floor_and_those_below() -> None:
    breaches = floor_breaches()
    assert not breaches, "imports up a floor:\n" + "\n".join(breaches)


def test_the_floor_check_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    for package in ("runagent/store", "runagent/fleet", "server", "backends"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
    (tmp_path / "runagent" / "store" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runagent.fleet import q\n"
    )
    (tmp_path / "runagent" / "store" / "b.py").write_text("def f():\n    from ..fleet import q\n")
    (tmp_path / "runagent" / "fleet" / "q.py").write_text("from runagent.store import a\n")
    assert floor_breaches(tmp_path) == [
        "runagent.store.a (store) -> runagent.fleet.q (fleet)",
        "runagent.store.b (store) -> runagent.fleet.q (fleet)",
    ]
