"""The backend interface stays where backends outside this repository import it from:
`runagent.backend` re-exports everything the interface's `__all__` names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import runagent.backend as public
import runagent.loop.backend as interface


def test_the_public_module_re_exports_every_name_of_the_interface() -> None:
    assert sorted(public.__all__) == sorted(interface.__all__)
    for name in interface.__all__:
        assert getattr(public, name) is getattr(interface, name), name


def test_a_backend_outside_the_repository_imports_the_public_module(tmp_path: Path) -> None:
    (tmp_path / "outside_backend.py").write_text(
        "from runagent.backend import Backend, LaunchSpec, RunContext\n"
        "class Outside(Backend):\n"
        "    name = 'outside'\n"
        "    def launch(self, ctx: RunContext) -> LaunchSpec:\n"
        "        return LaunchSpec(argv=('true',), env={}, cwd=ctx.working_dir)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", "import outside_backend; print(outside_backend.Outside.__mro__[1])"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "runagent.loop.backend.Backend" in done.stdout
