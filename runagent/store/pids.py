"""Which process a pid is: alive or not, and when it started, so that a pid the system gave to
another process since is never taken for the one a lock or a run-info recorded.

Read from /proc where there is one (a listing checks many holders, and /proc costs a fraction of
importing psutil), else through psutil.
"""

from __future__ import annotations

import os

START_TIME_TOLERANCE = 0.05  # seconds; psutil derives create_time from boot time and ticks

__all__ = [
    "START_TIME_TOLERANCE", "group_alive", "is_alive", "process_start_time", "stat_fields",
]  # fmt: skip


def stat_fields(pid: int | str) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name: [0] is the state (field 3 in
    proc(5)), [1] the parent, [3] the session, [19] the start time in ticks. OSError when there
    is no such process (or no /proc). The command name may hold spaces and parentheses, so the
    fields are split after its last ')'. (The reaper keeps its own: it imports only the
    standard library.)"""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 :].split()


def _proc_stat(pid: int) -> tuple[bytes, float]:
    """(state, start time) of `pid` from /proc, as psutil computes them; None if it is gone.

    Read directly rather than through psutil: this runs on every supervisor start and every
    liveness check, and /proc costs a fraction of importing psutil.
    """
    global _boot_time
    fields = stat_fields(pid)
    if _boot_time is None:
        with open("/proc/stat", "rb") as f:
            line = next(ln for ln in f if ln.startswith(b"btime "))
        _boot_time = float(line.split()[1])
    return fields[0], _boot_time + int(fields[19]) / _CLOCK_TICKS


_boot_time: float | None = None
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _state_and_start(pid: int) -> tuple[bool, float] | None:
    """(is a zombie, start time) of `pid`, or None if there is no such process."""
    try:
        state, started = _proc_stat(pid)
        return state == b"Z", started
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError, StopIteration):
        pass  # no /proc here: ask psutil
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE, proc.create_time()
    except (psutil.Error, ValueError):
        return None


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), or None if there is no such process."""
    found = _state_and_start(pid)
    return None if found is None else found[1]


def is_alive(pid: int | None, start_time: float | None) -> bool:
    """Whether `pid` is still the process that started at `start_time` (not a reused pid)."""
    if not pid:
        return False
    found = _state_and_start(pid)
    if found is None or found[0]:
        return False
    return start_time is None or abs(found[1] - start_time) <= START_TIME_TOLERANCE


def group_alive(pgid: int | None) -> bool:
    """Whether any process of the process group `pgid` is alive (a zombie leader's counts)."""
    if not pgid or pgid < 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: there
    except OSError:
        return False
    return True
