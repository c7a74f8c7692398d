"""Ray's exceptions are told apart in one module of the Ray executor, `boundary.py`, as httpx maps
its transport's errors in one place: every other module of runagent/executors/ray/ catches
run-agent's errors only. Read from the source, so it holds with Ray installed or not."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from runagent.errors import AlreadyRunningError, RunAgentError
from tests.conftest import REPO

PACKAGE = REPO / "runagent" / "executors" / "ray"
BOUNDARY = "boundary.py"


def ray_exception_names() -> set[str]:
    """The classes ray/exceptions.py defines, read from its source without importing Ray (an
    empty set where Ray is not installed: the other checks still hold)."""
    spec = importlib.util.find_spec("ray")  # a top-level package: found, not imported
    if spec is None or spec.origin is None:
        return set()
    source = Path(spec.origin).with_name("exceptions.py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def offences(path: Path, ray_classes: set[str]) -> list[str]:
    """Where the module at `path` names ray.exceptions or catches one of Ray's exception classes
    (however imported, or by a name Ray's exceptions module defines), as `line: what`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound: dict[str, str] = {}  # a name of the module -> what of Ray's it stands for
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ray":
                    bound[alias.asname or "ray"] = alias.name if alias.asname else "ray"
                    if alias.name.startswith("ray.exceptions"):
                        found.append(f"{node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] != "ray":
                continue
            for alias in node.names:
                origin = f"{node.module}.{alias.name}"
                bound[alias.asname or alias.name] = origin
                if origin.startswith("ray.exceptions"):
                    found.append(f"{node.lineno}: imports {origin}")

    def ray_origin(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return bound.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = ray_origin(expr.value)
            return f"{base}.{expr.attr}" if base else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ray_origin(node) == "ray.exceptions":
            found.append(f"{node.lineno}: names ray.exceptions")
        if not isinstance(node, ast.ExceptHandler) or node.type is None:
            continue
        caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        for expr in caught:
            origin = ray_origin(expr)
            name = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")
            if origin is not None or name in ray_classes:
                found.append(f"{node.lineno}: catches {origin or name}")
    return sorted(set(found), key=lambda line: int(line.split(":")[0]))


OTHERS = sorted(p for p in PACKAGE.rglob("*.py") if p.name != BOUNDARY)


def test_the_package_has_its_concerns_and_one_boundary() -> None:
    names = {p.name for p in OTHERS}
    assert {"__init__.py", "driver.py", "hostagent.py", "mirror.py", "store.py"} <= names
    assert (PACKAGE / BOUNDARY).is_file()
    # The rule has its one place: Ray's exceptions are named there.
    assert offences(PACKAGE / BOUNDARY, ray_exception_names())


@pytest.mark.parametrize("path", OTHERS, ids=lambda p: p.name)
def test_no_module_but_the_boundary_judges_a_ray_exception(path: Path) -> None:
    found = offences(path, ray_exception_names())
    assert not found, f"{path.relative_to(REPO)} judges Ray's exceptions itself: {found}"


def test_the_check_finds_ray_exceptions_however_they_are_named(tmp_path: Path) -> None:
    module = tmp_path / "planted.py"
    module.write_text(
        "import ray\n"  # 1
        "import ray.exceptions as rx\n"  # 2
        "from ray import exceptions\n"  # 3
        "from ray.exceptions import RayError\n"  # 4
        "from runagent.executors.ray.boundary import GoneError, RayActorError\n"  # 5
        "def f():\n"  # 6
        "    try:\n"  # 7
        "        pass\n"  # 8
        "    except ray.exceptions.GetTimeoutError:\n"  # 9
        "        pass\n"  # 10
        "    except (OSError, rx.RayTaskError):\n"  # 11
        "        pass\n"  # 12
        "    except RayActorError:\n"  # 13: a Ray class handed on by another module
        "        pass\n"  # 14
        "    except (GoneError, ValueError):\n"  # 15: run-agent's own, and a builtin
        "        pass\n"  # 16
    )
    found = offences(module, {"RayActorError", "RayTaskError", "GetTimeoutError", "RayError"})
    assert {int(line.split(":")[0]) for line in found} == {2, 3, 4, 9, 11, 13}, found
    assert "9: catches ray.exceptions.GetTimeoutError" in found
    clean = tmp_path / "clean.py"
    clean.write_text("import ray\ntry:\n    ray.get(1)\nexcept (GoneError, KeyError):\n    pass\n")
    assert offences(clean, {"RayError"}) == []


def raised_through_the_boundary(exc: BaseException) -> BaseException:
    from runagent.executors.ray import boundary

    with pytest.raises(BaseException) as caught, boundary.mapped():
        raise exc
    return caught.value


def test_the_boundary_turns_each_of_rays_failures_into_run_agents_own() -> None:
    rx = pytest.importorskip("ray.exceptions")
    from runagent.executors.ray import boundary as b

    def remote(cause: Exception) -> Exception:  # as ray.get raises what an actor raised
        made: Exception = rx.RayTaskError("HostAgent.stop", "Traceback ...", cause)
        return made.as_instanceof_cause()

    cases: list[tuple[Exception, type[Exception]]] = [
        (rx.GetTimeoutError("Get timed out: some object(s) not ready."), b.TimedOutError),
        (rx.ActorUnavailableError("restarting", None), b.RestartingError),
        (rx.ActorDiedError(), b.GoneError),
        (
            rx.ActorAlreadyExistsError("The name home (namespace=t) is already taken."),
            b.NameTakenError,
        ),
        (rx.RayError("Placement group p/t already exists.\ndetails"), b.NameTakenError),
        (remote(ValueError("'..' is outside the runs root")), b.RemoteError),
        (remote(b.GoneError("its own call found an actor gone")), b.RemoteError),
        (rx.RaySystemError("the GCS went away\nmore lines"), b.ClusterError),
    ]
    for raised, expected in cases:
        found = raised_through_the_boundary(raised)
        assert type(found) is expected, (raised, found)
        assert isinstance(found, RunAgentError) and "\n" not in str(found), found
    # Only the no-answer kinds say "try again later"; a gone actor is not one of them.
    assert issubclass(b.RestartingError, b.NoAnswerError)
    assert issubclass(b.TimedOutError, b.NoAnswerError)
    assert not issubclass(b.GoneError, b.NoAnswerError)
    # What an actor raised on purpose comes back as itself; what Ray did not raise is let be.
    refusal = AlreadyRunningError("task p/t is already running")
    assert raised_through_the_boundary(remote(refusal)) is refusal
    assert "ValueError: '..' is outside" in str(raised_through_the_boundary(cases[5][0]))
    plain = KeyError("x")
    assert raised_through_the_boundary(plain) is plain
