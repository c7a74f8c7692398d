"""`schedule crontab --install/--uninstall` against Debian's real `crontab`, in a private spool.

Each test runs its steps in a mount namespace of its own (`unshare -m`) with an empty tmpfs over
the crontab spool, so the real `crontab` binary reads and writes a crontab that no one else sees
and that is gone when the steps end: the machine's own crontabs are never read or touched.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Workspace

SPOOL = Path("/var/spool/cron/crontabs")

# Another user's crontab: variables, comments, blank lines, a %, another tool's block; every byte
# of it must come back as it was.
OTHER = (
    "MAILTO=ops@example.org\n"
    "# backups, keep first\n"
    "\n"
    "*/5 * * * * /usr/local/bin/backup --label 'a b' %daily\n"
    "  # an indented comment\n"
    "# BEGIN another tool\n"
    "@reboot /usr/bin/true\n"
    "# END another tool\n"
)


def _private_spool_works() -> str:
    """Why the tests cannot run here, or ''."""
    if os.geteuid() != 0:
        return "needs root, to mount a private crontab spool with unshare -m (CI runs as root)"
    if shutil.which("crontab") is None or shutil.which("unshare") is None:
        return "needs Debian's cron (apt-get install cron) and util-linux's unshare"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return "" if probe.returncode == 0 else "unshare -m is not allowed here"


# Skipped where it cannot run, never under CI (which installs cron and runs as root).
pytestmark = pytest.mark.skipif(
    bool(_private_spool_works()) and not os.environ.get("CI"), reason=_private_spool_works()
)


def in_private_spool(ws: Workspace, steps: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run shell `steps` one after another in one namespace with an empty private spool; each
    step's stdout, stderr and exit code, as if each had been run alone."""
    out = ws.path / "steps"
    out.mkdir(exist_ok=True)
    script = [
        "set -u",
        f"mount -t tmpfs -o mode=1730 tmpfs {SPOOL}",  # what Debian's package sets on the spool
        f"chgrp crontab {SPOOL}",
    ]
    for i, step in enumerate(steps):
        script.append(f"( {step} ) >{out}/{i}.out 2>{out}/{i}.err; echo $? >{out}/{i}.rc")
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "\n".join(script)],
        cwd=ws.path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [
        subprocess.CompletedProcess(
            step,
            int((out / f"{i}.rc").read_text()),
            (out / f"{i}.out").read_text(),
            (out / f"{i}.err").read_text(),
        )
        for i, step in enumerate(steps)
    ]


def write_schedules(ws: Workspace, config: Path, **schedules: dict[str, Any]) -> None:
    data = {
        "agents": {"fake": {"type": "command", "command": ws.agent_argv()}},
        "defaults": {"agent": "fake"},
        "storage": {"runs_dir": str(ws.root)},
        "schedules": {
            name: {"cron": "0 2 * * *", "project": "p", "prompt": "tidy up", **fields}
            for name, fields in schedules.items()
        },
    }
    config.write_text(yaml.safe_dump(data))


def cli(*args: str) -> str:
    return shlex.join([sys.executable, "-m", "runagent", *args])


def test_install_replaces_only_its_own_block_and_uninstall_gives_every_other_byte_back(
    ws: Workspace,
) -> None:
    write_schedules(ws, ws.config, nightly={"timezone": "Europe/Berlin"},
                    weekly={"cron": "@weekly", "enabled": False})  # fmt: skip
    second = ws.path / "second.yaml"
    write_schedules(ws, second, hourly={"cron": "@hourly"})
    change = {"nightly": {"cron": "30 3 * * *"}, "monthly": {"cron": "@monthly"}}
    changed = ws.path / "changed.yaml"
    write_schedules(ws, changed, **change)
    steps = [
        cli("schedule", "crontab", "--uninstall"),  # 0: no crontab at all yet
        f"printf '%s' {shlex.quote(OTHER)} | crontab -",
        cli("schedule", "crontab", "--install"),  # 2
        "crontab -l",
        cli("schedule", "crontab", "--install"),  # 4: again: nothing changes
        "crontab -l",
        cli("schedule", "crontab", "--install", "--config", str(second)),  # 6: a second config
        f"cp {shlex.quote(str(changed))} config.yaml && "
        + cli("schedule", "crontab", "--install"),  # 7: the first config changed
        "crontab -l",
        cli("schedule", "crontab", "--uninstall"),  # 9
        cli("schedule", "crontab", "--uninstall", "--config", str(second)),
        "crontab -l",  # 11
    ]
    r = in_private_spool(ws, steps)
    assert all(step.returncode == 0 for step in r), [(s.args, s.stderr) for s in r]
    assert "no run-agent block" in r[0].stderr
    assert r[2].stderr == (
        "run-agent: installed 1 schedule in your crontab; left out, disabled: weekly\n"
    )
    installed = r[3].stdout
    assert installed.startswith(OTHER)
    block = installed[len(OTHER) :].splitlines()
    config = ws.config.resolve()
    assert block[0] == f"# BEGIN run-agent schedules of {config}"
    assert block[-1] == f"# END run-agent schedules of {config}"
    assert "# left out, disabled: weekly" in block
    assert "CRON_TZ=Europe/Berlin" in block
    (line,) = [ln for ln in block if "schedule now nightly" in ln]
    assert line.startswith("0 2 * * * ") and f"--config {config}" in line
    assert r[5].stdout == installed  # idempotent
    final = r[8].stdout
    assert final.startswith(OTHER)
    assert final.count("# BEGIN run-agent") == 2 and "schedule now hourly" in final
    assert "schedule now monthly" in final and "30 3 * * * " in final
    assert "0 2 * * * " not in final.split(f"schedules of {config}\n", 1)[1].split("# END")[0]
    assert r[11].stdout == OTHER  # byte for byte


def test_printing_names_the_safe_install_and_the_disabled_schedules(ws: Workspace) -> None:
    write_schedules(ws, ws.config, nightly={}, weekly={"enabled": False})
    proc = ws.cli("schedule", "crontab")
    assert proc.returncode == 0, proc.stderr
    header = [ln for ln in proc.stdout.splitlines() if ln.startswith("#")][:2]
    assert "run-agent schedule crontab --install" in header[0]
    assert "| crontab -` would replace your whole crontab" in header[1]
    assert "# left out, disabled: weekly" in proc.stdout
    assert proc.stderr == "run-agent: left out, disabled: weekly\n"


def test_a_crontab_that_refuses_the_lines_is_left_as_it_was(ws: Workspace) -> None:
    write_schedules(ws, ws.config, nightly={})
    steps = [
        f"printf '%s' {shlex.quote(OTHER)} | crontab -",
        # The block's end line removed by hand: which lines are run-agent's is no longer known.
        cli("schedule", "crontab", "--install")
        + " && crontab -l | grep -v '^# END run-agent' | crontab -",
        cli("schedule", "crontab", "--install"),
        "crontab -l",
    ]
    r = in_private_spool(ws, steps)
    assert r[2].returncode == 2
    assert r[2].stderr.startswith("run-agent: the crontab has '# BEGIN run-agent schedules of ")
    assert r[2].stderr.rstrip().endswith("without its end line; fix it with `crontab -e`")
    assert r[3].stdout.startswith(OTHER) and "# END run-agent" not in r[3].stdout
