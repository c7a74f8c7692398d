"""config.yaml as data, parsed once per change of its text rather than once per command.

Parsing YAML means importing PyYAML, which costs a short command (`list`, a quick `job`) as much
as the rest of its start-up. The data a config parses to is kept as JSON in the user's cache
folder ($XDG_CACHE_HOME/run-agent/config/, else ~/.cache/...), beside the very text it was
parsed from: an entry is used only when that text equals the file's text now, so an edit, a
clock set back or a file swapped under the same name can never be served stale data. Data JSON
cannot hold exactly (a date, a key that is not a string) is not kept. The cache is an
optimisation only: any error reading or writing it is ignored, and RUN_AGENT_NO_CACHE=1 turns
it off. `remembered` keeps other facts a command would otherwise work out afresh each time it
starts (whether any installed package declares a backend) the same way, keyed on what they are
worked out from.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

VERSION = 2  # 2: one layout for every kept value (key, value)


def cache_folder(env: Mapping[str, str]) -> Path | None:
    """Where parsed configs are kept; None when caching is off or there is no home to keep it."""
    if env.get("RUN_AGENT_NO_CACHE"):
        return None
    base = env.get("XDG_CACHE_HOME") or (
        os.path.join(env["HOME"], ".cache") if env.get("HOME") else ""
    )
    return Path(base, "run-agent", "config") if base else None


def parsed(path: Path, text: str, parse: Callable[[str], Any], env: Mapping[str, str]) -> Any:
    """`parse(text)`, or what it gave before for this very text of `path`."""
    folder = cache_folder(env)
    if folder is None:
        return parse(text)
    name = f"{zlib.crc32(str(path.resolve()).encode()):08x}.json"
    return _cached(folder / name, text, lambda: parse(text), {"path": str(path)})


def remembered(name: str, key: Any, compute: Callable[[], Any], env: Mapping[str, str]) -> Any:
    """`compute()`, or what it gave before for this very `key` (JSON data that changes whenever
    what `compute` reads changes: its files' sizes and times, say)."""
    folder = cache_folder(env)
    if folder is None:
        return compute()
    return _cached(folder.parent / f"{name}.json", key, compute)


def _cached(entry: Path, key: Any, compute: Callable[[], Any], note: Any = None) -> Any:
    """The value kept in `entry` for exactly `key`, else `compute()`, kept there when JSON
    holds it (and its key) exactly."""
    try:
        kept = json.loads(entry.read_text(encoding="utf-8"))
        if kept.get("version") == VERSION and kept.get("key") == key:
            return kept["value"]
    except (OSError, ValueError, AttributeError, KeyError):
        pass
    value = compute()
    if _exact_in_json(value) and _exact_in_json(key):
        _keep(entry, {"version": VERSION, "key": key, "value": value, "note": note})
    return value


def _exact_in_json(data: Any) -> bool:
    """Whether JSON gives `data` back as it is: strings, numbers, booleans, null, lists and
    mappings with string keys, and nothing else."""
    if data is None or isinstance(data, str | bool | int | float):
        return True
    if isinstance(data, list):
        return all(_exact_in_json(item) for item in data)
    if isinstance(data, dict):
        return all(isinstance(k, str) and _exact_in_json(v) for k, v in data.items())
    return False


def _keep(entry: Path, record: dict[str, Any]) -> None:
    """Write the entry whole or not at all (a temp file renamed over it); errors ignored."""
    from runagent.store.runfolder import atomic_write  # only a config read anew writes one

    try:
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(entry, json.dumps(record))
    except (OSError, ValueError):
        pass
