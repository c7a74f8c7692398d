"""A head that dies, on a real Ray cluster whose head keeps its state in a real Redis (GCS fault
tolerance): loops on two hosts, the head's GCS SIGKILLed and started again; the loops go on,
`status`, `stop` and the page work again, nothing is started twice and nothing is orphaned.

Everything Ray runs in processes of their own (the cluster in tests/e2e/headcluster.py, each
command line, the server), as a user's would: this test never joins the cluster itself. Skipped
where the `ray` extra or `redis-server` is missing, except under CI (`CI` set), where either
fails the module.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

try:
    import ray  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("the ray extra is not installed (pip install -e '.[ray]')", allow_module_level=True)
if shutil.which("redis-server") is None:
    if os.environ.get("CI"):
        raise RuntimeError(
            "redis-server is missing; .ci/run installs it (apt-get install redis-server)"
        )
    pytest.skip(
        "redis-server is not installed (apt-get install redis-server)", allow_module_level=True
    )

from runagent.errors import ExitCode
from tests.conftest import Workspace, alive, free_port, serving, wait_for

HERE = Path(__file__).resolve().parent


@dataclass
class HeadCluster:
    address: str
    process: subprocess.Popen[str]

    def tell(self, command: str, answer: str) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == answer


@pytest.fixture
def head_cluster(tmp_path: Path) -> Iterator[HeadCluster]:
    """A Redis server and a cluster whose head keeps its state in it, both gone at the end with
    every process they started."""
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir=os.environ.get("TMPDIR", "/tmp")))
    env = {**os.environ, "RAY_REDIS_ADDRESS": f"127.0.0.1:{port}", "RAY_TMPDIR": str(ray_tmp)}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "headcluster.py")], env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[:1] == ["address"], f"the cluster did not start: {first}"
        yield HeadCluster(first[1], proc)
    finally:
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        redis.kill()
        redis.wait(10)
        _kill_under(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _kill_under(folder: Path) -> None:
    """Whatever Ray process still names the cluster's temp folder (a raylet or a worker)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(str(folder) in part for part in proc.info["cmdline"] or []):
                proc.kill()


def configure(ws: Workspace, address: str) -> None:
    ws.write_config(["--setsid-grandchild", "--wait-pids", "2", "--sleep", "300"])
    data = yaml.safe_load(ws.config.read_text())
    data["executor"] = {"type": "ray", "address": address, "namespace": "head"}
    ws.config.write_text(yaml.safe_dump(data))


def cli(ws: Workspace, *args: str) -> subprocess.CompletedProcess[str]:
    return ws.cli(*args, "--config", str(ws.config), timeout=180)


def statuses(ws: Workspace) -> dict[str, dict[str, Any]]:
    done = cli(ws, "list", "--json")
    assert done.returncode == 0, done.stderr
    return {t["task_id"]: t for t in json.loads(done.stdout)}


def test_loops_outlive_a_head_that_dies_when_its_state_is_in_redis(
    ws: Workspace, head_cluster: HeadCluster
) -> None:
    configure(ws, head_cluster.address)
    doctor = cli(ws, "doctor")
    assert "the head's state is kept in Redis (GCS fault tolerance)" in doctor.stdout, doctor
    hosts = {}
    for name in ("a", "b"):
        done = cli(ws, "run", "-p", "p", "-t", name, "--detach", "go")
        assert done.returncode == 0, done.stderr
        found = re.search(r"supervisor pid (\d+) on host (host[BC])\)", done.stderr)
        assert found is not None, done.stderr
        hosts[name] = (int(found[1]), found[2])
    assert {h for _, h in hosts.values()} == {"hostB", "hostC"}  # one slot each
    agents = wait_for(lambda: len(ws.agent_pids()) >= 4 and ws.agent_pids(), 60, "four agents")
    before = statuses(ws)
    assert {t: before[t]["status"] for t in "ab"} == {"a": "running", "b": "running"}
    with serving(ws) as url:  # a server up through it all, joined to the cluster before
        import httpx

        row = httpx.get(f"{url}/api/projects/p/tasks/a", timeout=60).json()
        assert row["status"] == "running" and row["supervisor_host"] == hosts["a"][1]

        head_cluster.tell("kill", "killed")
        head_cluster.tell("start", "started")

        # The loops went on: the same supervisors and agents, none started twice.
        after = wait_for(lambda: _running(ws), 120, "status to answer again after the restart")
        for name, (pid, on) in hosts.items():
            assert after[name]["supervisor_pid"] == pid and after[name]["supervisor_host"] == on
            assert alive(pid)
            assert after[name]["runs"] == 1  # its first run goes on: none lost nor started again
        assert all(alive(p) for p in agents) and sorted(ws.agent_pids()) == sorted(agents)
        again = cli(ws, "run", "-p", "p", "-t", "a", "--detach", "go")
        assert again.returncode == ExitCode.ALREADY_RUNNING, again.stderr
        assert f"on host {hosts['a'][1]}" in again.stderr
        # The page's server answers again, sees them running, and stops one.
        row = wait_for(lambda: _row(url, "a"), 120, "the page's API after the restart")
        assert row["status"] == "running" and row["supervisor_host"] == hosts["a"][1]
        stopped = httpx.post(f"{url}/api/projects/p/tasks/a/stop", json={}, timeout=120)
        assert stopped.status_code == 200 and stopped.json()["stopped"] is True
    stopped = cli(ws, "stop", "-p", "p", "-t", "b")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    wait_for(lambda: not [p for p in agents if alive(p)], 30, "every agent to go")
    assert not [pid for pid, _ in hosts.values() if alive(pid)]
    assert {t["status"] for t in statuses(ws).values()} == {"stopped"}
    wait_for(lambda: not ws.leftovers(), 30, "nothing left")


def _row(url: str, task: str) -> dict[str, Any] | None:
    import httpx

    try:
        answer = httpx.get(f"{url}/api/projects/p/tasks/{task}", timeout=30)
    except httpx.HTTPError:
        return None
    return answer.json() if answer.status_code == 200 else None


def _running(ws: Workspace) -> dict[str, dict[str, Any]] | None:
    done = ws.cli("list", "--json", "--config", str(ws.config), timeout=180)
    if done.returncode != 0:
        return None
    rows = {t["task_id"]: t for t in json.loads(done.stdout)}
    return rows if all(rows[t]["status"] == "running" for t in "ab") else None
