"""Which program run-agent itself runs on the host (bwrap, git): found on the absolute folders of
PATH alone, never in a folder an agent may write.

A relative PATH entry (`./node_modules/.bin`, `.`, an empty one) names whatever folder a command
runs in, which in the README's layout is the folder the agent works in: an agent that left a
`bwrap` or a `git` there would have it run on the host, outside any sandbox. So relative entries
are skipped, and so are absolute ones inside the current folder or inside `not_under` (the
agent's working folder), unless that folder is the home or holds it (PATH's own folders live
there, and an agent never works in the home itself).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path


def trusted(
    name: str, env: Mapping[str, str] | None = None, not_under: Iterable[Path] = ()
) -> str | None:
    """The full path of `name` on the trusted folders of PATH (see the module), or None."""
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    home = Path(os.environ.get("HOME") or "/").resolve()
    avoided = []
    for folder in (Path.cwd(), *not_under):
        try:
            resolved = folder.resolve()
        except OSError:
            continue
        if not home.is_relative_to(resolved):  # not the home, nor a folder that holds it
            avoided.append(resolved)
    kept = []
    for entry in path.split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        resolved = Path(entry).resolve()
        if not any(resolved.is_relative_to(a) for a in avoided):
            kept.append(entry)
    return shutil.which(name, path=os.pathsep.join(kept))
