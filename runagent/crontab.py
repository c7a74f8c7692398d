"""run-agent's block in a user's crontab: its lines, and putting it in or taking it out without
touching any other line.

The block is marked by a begin and an end line naming run-agent and the config file, so one
crontab can hold the blocks of several configs, and installing again replaces only its own.
It is kept last in the crontab: its `CRON_TZ` lines hold for every line after them, and there
none but its own follow. PATH is given on each command, not as a line, for the same reason.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from runagent.config.settings import ScheduleConfig
from runagent.errors import MissingDependencyError, RunAgentError, UsageError
from runagent.record import record
from runagent.store import runfolder

BEGIN = "# BEGIN run-agent schedules of "
END = "# END run-agent schedules of "


@record
class Block:
    """The crontab lines of one config's enabled schedules, and the disabled ones left out."""

    config: Path
    lines: tuple[str, ...]  # begin marker to end marker, each without its newline
    installed: tuple[str, ...]  # the schedules it fires
    left_out: tuple[str, ...]  # disabled schedules, named so that no one wonders where they went

    @property
    def text(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


def block(
    schedules: Mapping[str, ScheduleConfig],
    config: Path,
    root: Path,
    cwd: Path,
    launcher: Sequence[str],
    path: str,
) -> Block:
    """The block that fires `schedules` with `launcher` (`run-agent`'s argv), from `cwd`."""
    enabled = [c for c in schedules.values() if c.enabled]
    left_out = tuple(c.name for c in schedules.values() if not c.enabled)
    log = runfolder.schedule_log_path(root)
    lines = [f"{BEGIN}{config}", "# (managed by `run-agent schedule crontab --install`; "
             "edits here are replaced)"]  # fmt: skip
    if left_out:
        lines.append(f"# left out, disabled: {', '.join(left_out)}")
    for c in enabled:
        argv = [*launcher, "schedule", "now", c.name, "--config", str(config), "--root", str(root)]
        lines.append(f"CRON_TZ={c.timezone}")
        lines.append(
            f"{c.cron} mkdir -p {shlex.quote(str(root))} && cd {shlex.quote(str(cwd))} && "
            f"PATH={shlex.quote(path)} {shlex.join(argv)} >> {shlex.quote(str(log))} 2>&1"
        )
    lines.append(f"{END}{config}")
    for line in lines:
        if "\n" in line or "\r" in line:
            raise UsageError(f"a path holds a line break, which a crontab cannot hold: {line!r}")
    # cron turns an unescaped % into a line break; a backslash keeps it a %.
    escaped = tuple(ln if ln.startswith("#") else ln.replace("%", "\\%") for ln in lines)
    return Block(config, escaped, tuple(c.name for c in enabled), left_out)


def without_block(text: str, config: Path) -> tuple[str, bool]:
    """`text` (a crontab) without the block of `config`, every other line as it was, and
    whether there was one."""
    lines = text.splitlines(keepends=True)
    begin, end = f"{BEGIN}{config}", f"{END}{config}"
    kept: list[str] = []
    inside = found = False
    for line in lines:
        bare = line.rstrip("\r\n")
        if bare == begin:
            inside = found = True
        elif inside and bare == end:
            inside = False
        elif not inside:
            kept.append(line)
    if inside:  # a begin with no end: the block was cut short by hand; keep what follows it
        raise UsageError(
            f"the crontab has {begin!r} without its end line; fix it with `crontab -e`"
        )
    return "".join(kept), found


def with_block(text: str, new: Block) -> str:
    """`text` with `new` in place of its config's old block, last (see the module's note)."""
    rest, _ = without_block(text, new.config)
    if rest and not rest.endswith("\n"):
        rest += "\n"
    return rest + new.text


def read() -> str:
    """The user's crontab as `crontab -l` gives it; empty when there is none."""
    proc = _crontab(["-l"])
    if proc.returncode != 0:
        if "no crontab for" in proc.stderr:
            return ""
        raise RunAgentError(f"`crontab -l` failed: {_said(proc)}")
    return proc.stdout


def write(text: str) -> None:
    """Make `text` the user's crontab (`crontab -`, which checks it before taking it)."""
    proc = _crontab(["-"], text)
    if proc.returncode != 0:
        raise RunAgentError(f"`crontab -` refused the new crontab, which is left as it was: "
                            f"{_said(proc)}")  # fmt: skip


def _crontab(args: list[str], text: str | None = None) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("crontab")
    if executable is None:
        raise MissingDependencyError(
            "'crontab' not found on PATH; install cron, or print the lines with "
            "`run-agent schedule crontab` and add them yourself"
        )
    return subprocess.run(
        [executable, *args], input=text, capture_output=True, timeout=60, check=False,
        encoding="utf-8", errors="surrogateescape",  # other users' lines go back byte for byte
    )  # fmt: skip


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    return " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
