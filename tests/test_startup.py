"""Start-up: each command imports what it uses, and `--help` and completion still list every
command with its short help. Guarded by what gets imported, never by a stopwatch."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

import backends
import runagent
import runagent.cli
from runagent.cli.group import LAZY, cli
from runagent.config import file as configfile
from runagent.config.file import parse_config
from runagent.store import runfolder
from runagent.store.runinfo import RunStatus
from tests.conftest import REPO, Workspace


def test_the_lazy_table_names_every_command_with_its_own_short_help() -> None:
    for module in pkgutil.iter_modules(runagent.cli.__path__):
        importlib.import_module(f"runagent.cli.{module.name}")  # registers all there is
    assert set(cli.commands) == set(LAZY)
    context = click.Context(cli)
    for name, lazy in LAZY.items():
        command = cli.get_command(context, name)
        assert command is not None and command.callback is not None, name
        assert command.callback.__module__ == lazy.module, name
        for width in (20, 45, 60, 80, 200):
            table = click.Command(name, help=lazy.short_help).get_short_help_str(width)
            assert table == command.get_short_help_str(width), (name, width)


# Runs `run-agent ARGS` inside one interpreter, then writes every module it had imported.
PROBE = """
import json, sys
out, *args = sys.argv[1:]
sys.argv = ["run-agent", *args]
try:
    from runagent.cli import main
    main()
except SystemExit:
    pass
finally:
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)
"""

# Heavy or needless on the way to a version, a listing or a one-run job (the fleet's code: with
# no limits and no queue under the root). Those click itself
# imports (inspect, uuid, and urllib through pathlib) are left out below: no path avoids them.
NEVER = {"starlette", "uvicorn", "sse_starlette", "watchfiles", "psutil", "ray", "server",
         "zoneinfo", "urllib", "uuid", "inspect", "runagent.schedule", "runagent.executors.control",
         "runagent.executors.ray", "runagent.ops", "runagent.paste", "runagent.doctor",
         "runagent.fleet"}  # fmt: skip


def imported(tmp_path: Path, *args: str, cwd: Path | None = None) -> set[str]:
    out = tmp_path / f"modules-{len(list(tmp_path.glob('modules-*')))}.json"
    done = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], cwd=cwd or tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return set(json.loads(out.read_text()))


def beyond_click(
    tmp_path: Path, modules: set[str], allowed: frozenset[str] = frozenset()
) -> set[str]:
    """The forbidden packages (and their modules) among `modules` that click does not import,
    but those `allowed` on this path."""
    done = subprocess.run(
        [sys.executable, "-c", "import click, json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    click_needs = set(json.loads(done.stdout))
    never = NEVER - allowed
    return {m for m in modules - click_needs if m.split(".")[0] in never or m in never
            or any(m.startswith(f"{n}.") for n in never)} - HOLDS_A_SETTING - allowed  # fmt: skip


def ours(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in ("runagent", "backends", "server")}


# What of run-agent's own each path loads, at most (the modules of its commands' paths on the
# way to its work): one more is a cost every such command pays, so it is added here knowingly,
# after `python -X importtime` and bench/overhead.py (docs/performance.md) say what it costs.
# A path may load fewer.
CONFIG = {"runagent", "runagent.cli", "runagent.cli.group", "runagent.cli.options",
          "runagent.config", "runagent.config.file", "runagent.config.parsed",
          "runagent.config.section", "runagent.config.settings", "runagent.duration",
          "runagent.errors", "runagent.ops", "runagent.record", "backends",
          "runagent.store", "runagent.store.credentials", "runagent.store.host",
          "runagent.store.ids", "runagent.store.lock", "runagent.store.pids",
          "runagent.store.race", "runagent.store.runfolder", "runagent.store.runinfo",
          "runagent.store.taskfolder", "runagent.store.tasks",
          "runagent.store.yamltext"}  # fmt: skip
LIST = CONFIG | {"runagent.cli.show", "runagent.listing"}
JOB = LIST - {"runagent.cli.show"} | {
    "backends.command", "runagent.backend", "runagent.cli.console", "runagent.cli.foreground",
    "runagent.cli.loopargs", "runagent.cli.run", "runagent.config.overrides",
    "runagent.config.userfile", "runagent.executors", "runagent.executors.local",
    "runagent.loop", "runagent.loop.attempt", "runagent.loop.backend", "runagent.loop.budget",
    "runagent.loop.completion", "runagent.loop.context", "runagent.loop.events",
    "runagent.loop.failure", "runagent.loop.lines", "runagent.loop.needs",
    "runagent.loop.notify", "runagent.loop.prompt", "runagent.loop.redaction",
    "runagent.loop.stuck", "runagent.loop.supervisor", "runagent.process", "runagent.service",
    "runagent.store.spend", "runagent.store.steering",
}  # fmt: skip
# The fleet's gate and queue: on a job's path only under `limits:` or beside a queue.
GATE = {"runagent.fleet", "runagent.fleet.depends", "runagent.fleet.gate",
        "runagent.fleet.index", "runagent.fleet.queue", "runagent.store.jsonfile"}  # fmt: skip
# Loaded by none of the commands below: the server, the SDKs, what a job that cannot restart
# never needs (a git look for stuck detection, OpenSSL's hashes).
SERVER = {"server", "starlette", "uvicorn", "sse_starlette", "mcp", "prometheus_client", "ray",
          "httpx", "watchfiles", "psutil"}  # fmt: skip


def with_fleet(ws: Workspace, limits: bool = True, queue: bool = True) -> None:
    """`limits:` in the workspace's config and/or the fleet's folder (a queue) under its root."""
    if limits:
        data = yaml.safe_load(ws.config.read_text())
        ws.config.write_text(yaml.safe_dump({**data, "limits": {"max_running": 2}}))
    if queue:
        (ws.root / runfolder.FLEET).mkdir(parents=True)


# A package whose own module holds only what config.yaml names of it (`ops.approvals`'s choices):
# loading it costs an enum; any module of it is still never loaded where it is not used.
HOLDS_A_SETTING = {"runagent.ops"}


def test_version_alone_imports_neither_click_nor_any_command(tmp_path: Path) -> None:
    modules = imported(tmp_path, "--version")
    ours = {m for m in modules if m.split(".")[0] in ("runagent", "backends", "server")}
    assert ours == {"runagent", "runagent.cli"}, ours
    assert not {"click", "yaml", "typing", "dataclasses"} & modules


def test_version_with_anything_else_is_clicks_and_imports_none_of_the_commands(
    tmp_path: Path,
) -> None:
    modules = imported(tmp_path, "--version", "--version")  # no longer the fast path's alone
    ours = {m for m in modules if m.split(".")[0] in ("runagent", "backends", "server")}
    assert ours <= {
        "runagent",
        "runagent.cli",
        "runagent.cli.group",
        "runagent.errors",
        "runagent.record",
    }, ours
    assert "yaml" not in modules
    assert not beyond_click(tmp_path, modules)


def test_the_version_line_without_click_is_the_one_click_prints(ws: Workspace) -> None:
    fast = ws.cli("--version")
    through_click = ws.cli("--version", "--version")
    assert fast.returncode == through_click.returncode == 0, (fast.stderr, through_click.stderr)
    assert fast.stdout == through_click.stdout == f"run-agent, version {runagent.__version__}\n"


def test_list_on_an_empty_root_loads_no_backend(ws: Workspace) -> None:
    (ws.path / "empty").mkdir()
    modules = imported(ws.path, "list", "--root", str(ws.path / "empty"), cwd=ws.path)
    assert "runagent.cli.show" in modules and "runagent.config.settings" in modules
    assert not {m for m in modules if m.startswith("backends.")}
    loaded = {"runagent.loop.backend", "runagent.loop.supervisor", "runagent.store.follow",
              "runagent.issues.worktree", "runagent.cli.run", "runagent.cli.serve",
              "tempfile", "runagent.service", "runagent.issues.issue",
              "runagent.issues.repository", "subprocess", "shutil"} & modules  # fmt: skip
    assert not loaded
    assert not beyond_click(ws.path, modules)
    assert ours(modules) <= LIST, ours(modules) - LIST
    assert "yaml" not in imported(ws.path, "list", "--root", str(ws.path / "empty"), cwd=ws.path)


def test_a_job_loads_its_one_backend_and_no_server(ws: Workspace) -> None:
    modules = imported(ws.path, "job", "-q", "-p", "p", "-t", "t", "go", cwd=ws.path)
    assert ws.runs()[0].status is RunStatus.COMPLETED
    assert {m for m in modules if m.startswith("backends.")} == {"backends.command"}
    assert not {"runagent.cli.serve", "runagent.cli.schedule", "runagent.cli.issues"} & modules
    assert not beyond_click(ws.path, modules)
    assert ours(modules) <= JOB, ours(modules) - JOB
    assert not {"hashlib", "shutil", "runagent.issues.repository"} & modules


@pytest.mark.parametrize("limits, queue", [(True, False), (False, True)])
def test_a_job_under_limits_or_beside_a_queue_loads_the_gate_and_no_more(
    ws: Workspace, limits: bool, queue: bool
) -> None:
    with_fleet(ws, limits, queue)
    modules = imported(ws.path, "job", "-q", "-p", "p", "-t", "t", "go", cwd=ws.path)
    assert ws.runs()[0].status is RunStatus.COMPLETED
    assert "runagent.fleet.gate" in modules  # the gated path it is
    assert ours(modules) <= JOB | GATE, ours(modules) - JOB - GATE
    assert not beyond_click(ws.path, modules, allowed=frozenset({"runagent.fleet"}))


def test_a_job_beside_scoped_tokens_reads_none_of_them(ws: Workspace) -> None:
    made = ws.cli("token", "create", "--scope", "read")
    assert made.returncode == 0, made.stderr
    modules = imported(ws.path, "job", "-q", "-p", "p", "-t", "t", "go", cwd=ws.path)
    assert ws.runs()[0].status is RunStatus.COMPLETED
    assert ours(modules) <= JOB, ours(modules) - JOB
    assert not beyond_click(ws.path, modules)


def test_a_list_of_a_fleet_loads_its_queue_and_no_more(ws: Workspace) -> None:
    with_fleet(ws)
    modules = imported(ws.path, "list", cwd=ws.path)
    assert ours(modules) <= LIST | GATE - {"runagent.fleet.gate", "runagent.fleet.depends"}
    assert not beyond_click(ws.path, modules, allowed=frozenset({"runagent.fleet"}))
    assert not {m.split(".")[0] for m in modules} & SERVER


@pytest.mark.parametrize(
    "args, own",
    [
        (("fleet",), LIST | GATE | {"runagent.cli.fleet", "runagent.fleet.overview",
                                    "runagent.config.overrides", "runagent.loop",
                                    "runagent.loop.context", "runagent.loop.needs",
                                    "runagent.service", "runagent.store.spend",
                                    "runagent.store.steering",  # and, as any listing with
                                    "runagent.store.index",  # a task, the root's index
                                    "runagent.store.removed"}),
        (("token", "list"), LIST | {"runagent.cli.tokens", "runagent.store.tokens",
                                    "runagent.store.jsonfile", "runagent.loop",
                                    "runagent.loop.context"}),
        (("serve", "--help"), CONFIG | {"runagent.cli.serve"}),
        (("mcp", "--help"), CONFIG | {"runagent.cli.mcpserve"}),
    ],
)  # fmt: skip
def test_the_fleet_token_serve_and_mcp_commands_load_no_server_until_they_serve(
    ws: Workspace, args: tuple[str, ...], own: set[str]
) -> None:
    with_fleet(ws)
    made = ws.cli("token", "create", "--scope", "read")
    assert made.returncode == 0, made.stderr
    modules = imported(ws.path, *args, cwd=ws.path)
    assert ours(modules) <= own, ours(modules) - own
    assert not {m.split(".")[0] for m in modules} & SERVER
    assert not beyond_click(ws.path, modules, allowed=frozenset({"runagent.fleet"}))


def test_a_server_loads_prometheus_only_with_a_scrape(tmp_path: Path) -> None:
    probe = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from server.app import Settings, create_app\n"
        f"create_app(Settings(root=Path({str(tmp_path)!r})))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    tops = {m.split(".")[0] for m in json.loads(done.stdout)}
    assert not tops & {"prometheus_client", "ray", "psutil"}, tops


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")
def test_libyaml_reads_the_config_and_a_run_info_as_pyyaml_does(ws: Workspace) -> None:
    assert configfile.fast_loader().__mro__[1] is yaml.CSafeLoader
    text = (REPO / "config.yaml").read_text(encoding="utf-8")
    fast = yaml.load(text, Loader=configfile.fast_loader())
    slow = yaml.load(text, Loader=configfile.config_loader(yaml.SafeLoader))
    assert fast == slow and fast["agents"]
    for loader in (configfile.fast_loader(), configfile.config_loader(yaml.SafeLoader)):
        assert yaml.load("on: [yes, true]", Loader=loader) == {"on": ["yes", True]}
    names = backends.known()
    assert parse_config(fast, base_dir=REPO, backend_names=names) == parse_config(
        slow, base_dir=REPO, backend_names=names
    )
    assert ws.cli("job", "-q", "-p", "p", "-t", "t", "go").returncode == 0
    (run,) = (ws.task().folder / "runs").iterdir()
    info = (run / runfolder.RUN_INFO).read_text(encoding="utf-8")
    assert yaml.load(info, Loader=yaml.CSafeLoader) == yaml.safe_load(info)
    record = yaml.safe_load(info)
    written = runfolder.dump_yaml(record, sort_keys=False, allow_unicode=True)
    assert yaml.safe_load(written) == record


def test_the_collector_runs_again_once_a_command_starts(tmp_path: Path) -> None:
    # Off while the command loads (runagent/cli/__init__.py), on for the command's own work,
    # with what was loaded left out of its collections; on again too after a refused command.
    probe = (
        "import gc, sys\n"
        "from runagent.cli import main\n"
        "seen = []\n"
        "for args in (['list', '--root', sys.argv[1]], ['lsit']):\n"
        "    sys.argv = ['run-agent', *args]\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        seen.append(gc.isenabled())\n"
        "print(seen, gc.get_freeze_count() > 0)\n"
    )
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "empty")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.stdout.split("\n")[-2] == "[True, True] True", done.stdout + done.stderr
