"""What a run-agent credential looks like, and keeping them out of what the loops hand on: a
loop's command line imports this, not the token store."""

from __future__ import annotations

import re
from collections.abc import Mapping

TOKEN = re.compile(r"rat_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")  # rat_<id>_<secret>


def scrub(env: Mapping[str, str], key_variable: str) -> dict[str, str]:
    """`env` without the server's API key (`key_variable`) and any token: an agent, a queued
    start's record and a detached supervisor never hold a credential of run-agent itself (an
    agent told to could hand it on)."""
    return {k: v for k, v in env.items() if k != key_variable and not TOKEN.search(v)}
