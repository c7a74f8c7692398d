"""Why a failed run failed: the Diagnosis a backend gives, and the signals it reads it from.

Structured signals come first (an HTTP status, a provider's error type, a reset time); text
patterns are a fallback, applied only to error text (error events, stderr), never to the model's
own answer, and never to a run that was stopped or timed out by run-agent.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runagent.record import record
from runagent.store.runinfo import Reason


class _Pattern:
    """A regex compiled on first use: most runs never fail, so most never need one."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self.flags = flags
        self._compiled: re.Pattern[str] | None = None

    def search(self, text: str) -> re.Match[str] | None:
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self.flags)
        return self._compiled.search(text)


_RATE_LIMIT = _Pattern(
    r"rate[ _-]?limit|too many requests|\b429\b|resource[ _]exhausted|usage[ _]limit|"
    r"quota exceeded|exceeded your current quota|hit your (usage )?limit|overloaded",
    re.IGNORECASE,
)
_AUTH = _Pattern(
    r"\b401\b|\b403\b|unauthori[sz]ed|invalid[ _-]?(x-)?api[ _-]?key|api[ _]key[ _]invalid|"
    r"authentication[ _]error|not logged in|please run /login|permission[ _]denied|"
    r"missing environment variable|no api key|api key not valid|forbidden",
    re.IGNORECASE,
)
_RETRY_IN = _Pattern(
    r"(?:retry|try again) (?:in|after) (\d+(?:\.\d+)?)\s*"
    r"(ms|s|sec|seconds?|m|min|minutes?|h|hours?)\b",
    re.IGNORECASE,
)
_RESETS_IN = _Pattern(
    r"\"?(?:resets_in_seconds|retry_after|retryAfter)\"?\s*[:=]\s*\"?(\d+(?:\.\d+)?)"
)
_RETRY_DELAY = _Pattern(r"\"retryDelay\"\s*:\s*\"(\d+(?:\.\d+)?)s\"")
_RESETS_AT = _Pattern(r"\"?(?:resets_at|resetsAt)\"?\s*[:=]\s*\"?(\d{9,11})")


@record
class Diagnosis:
    """A failed run's reason, in words, and when a rate limit lifts (seconds from now), if known."""

    reason: Reason
    message: str
    retry_after: float | None = None


def from_status(status: int, message: str, retry_after: float | None = None) -> Diagnosis:
    """The diagnosis of an HTTP error status from a model provider."""
    if status == 429:
        return Diagnosis(Reason.RATE_LIMIT, f"rate limited (HTTP 429): {message}", retry_after)
    if status in (401, 403):
        return Diagnosis(Reason.AUTH, f"authentication failed (HTTP {status}): {message}")
    return Diagnosis(Reason.API_ERROR, f"API error (HTTP {status}): {message}")


def from_text(text: str) -> Diagnosis | None:
    """A diagnosis from error text alone, or None if it says nothing recognisable."""
    line = _first_line(text)
    if _RATE_LIMIT.search(text):
        return Diagnosis(Reason.RATE_LIMIT, f"rate limited: {line}", retry_after(text))
    if _AUTH.search(text):
        return Diagnosis(Reason.AUTH, f"authentication failed: {line}")
    return None


def retry_after(text: str, now: float | None = None) -> float | None:
    """Seconds until a limit lifts, from any reset hint in `text`; None if there is none."""
    if m := _RESETS_IN.search(text):
        return float(m.group(1))
    if m := _RETRY_DELAY.search(text):
        return float(m.group(1))
    if m := _RESETS_AT.search(text):
        return max(0.0, float(m.group(1)) - (time.time() if now is None else now))
    if m := _RETRY_IN.search(text):
        unit = m.group(2).lower()
        scale = 0.001 if unit == "ms" else {"s": 1, "m": 60, "h": 3600}[unit[0]]
        return float(m.group(1)) * scale
    return None


def http_retry_after(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (seconds, or an HTTP date) in seconds from now."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        moment = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, moment - (time.time() if now is None else now))


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line[:limit] + ("..." if len(line) > limit else "")


LINE_LIMIT = 16 << 20  # bytes of one line of an agent's stream read as an event; longer: skipped


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, skipping lines that are not (a torn or injected line),
    read a line at a time in bounded memory: a line longer than LINE_LIMIT (a stdout an agent
    grew with ftruncate is one line of NULs as long as it likes) is skipped, not read whole."""
    try:
        with open(path, "rb") as f:
            while line := f.readline(LINE_LIMIT):
                if len(line) == LINE_LIMIT and not line.endswith(b"\n"):
                    while (rest := f.readline(LINE_LIMIT)) and not rest.endswith(b"\n"):
                        pass  # the rest of a line too long to be an event
                    continue
                line = line.strip()
                if not line.startswith(b"{"):
                    continue
                try:
                    value = json.loads(line.decode("utf-8", errors="replace"))
                except ValueError:
                    continue
                if isinstance(value, dict):
                    yield value
    except OSError:
        return
