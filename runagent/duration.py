"""Durations as people write them (`90`, `500ms`, `30s`, `5m`, `1h30m`, `off`), read into seconds
for config.yaml, the command line and the API alike."""

from __future__ import annotations

import math
import re

from runagent.errors import ConfigError, shown

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# Longer than anything a loop waits for, and short enough for every clock and select() call.
MAX_DURATION = 365 * 86400.0


def parse_duration(value: object, where: str, none: str = "0: none") -> float | None:
    """Seconds from `90`, `2.5`, `"500ms"`, `"30s"`, `"5m"`, `"1h30m"`; 0, null or "off": None.
    `none` says, in a refusal of a duration too long, how to ask for none."""
    if value is None or value == 0 or value in ("off", "none", "0"):
        return None
    seconds = _seconds(value)
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(
            f"{where}: {shown(value)} is not a duration; use seconds or a form like 30s, 5m, 1h30m"
        )
    if seconds > MAX_DURATION:
        raise ConfigError(
            f"{where}: {shown(value)} is longer than 365 days; give a shorter duration ({none})"
        )
    return seconds or None


MAX_TEXT = 64  # characters of the longest duration read


def _seconds(value: object) -> float | None:
    """The number of seconds `value` spells, or None if it spells none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # a whole number too large for a float: no duration
            return None
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if len(text) > MAX_TEXT:  # no duration is spelled that long (and a regex stays fast)
            return None
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNITS[u] for n, u in parts)
        try:
            return float(text)
        except ValueError:
            return None
    return None


def words(seconds: float) -> str:
    """A time span as a person reads it: "45s", "12m 3s", "3h 20m", "2d 4h"."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"
