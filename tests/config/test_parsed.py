"""The parsed-config cache: a command after the first reads config.yaml without PyYAML, and
never gets data for any text but the file's own now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import backends
from runagent.config import parsed
from runagent.config.file import load_config

CONFIG = "agents:\n  noop:\n    type: command\n    command: [/bin/true]\ndefaults:\n  agent: noop\n"

# Loads the config in a fresh interpreter; prints the default agent and whether yaml was loaded.
PROBE = """
import sys
from pathlib import Path
import backends
from runagent.config.file import load_config
config = load_config(Path(sys.argv[1]), backends.known(), Path.cwd())
print(config.defaults.agent, "yaml" in sys.modules)
"""


def probe(config: Path, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, str(config)], env=env,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.strip()


def test_the_second_command_reads_the_config_without_pyyaml(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert probe(config, env) == "noop True"
    assert probe(config, env) == "noop False"
    env["RUN_AGENT_NO_CACHE"] = "1"
    assert probe(config, env) == "noop True"


def test_an_edit_is_read_whatever_the_file_times_say(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    stat = config.stat()
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert load_config(config, backends.known(), tmp_path, env).defaults.agent == "noop"
    # Same size, same modification time: only the text tells them apart.
    config.write_text(CONFIG.replace("noop", "nope"))
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_config(config, backends.known(), tmp_path, env).defaults.agent == "nope"


def test_a_damaged_or_foreign_entry_is_ignored(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    load_config(config, backends.known(), tmp_path, env)
    (entry,) = (tmp_path / "cache" / "run-agent" / "config").glob("*.json")
    assert oct(entry.stat().st_mode & 0o777) == "0o600"
    for damage in ("{not json", "[]", json.dumps({"version": 1, "text": CONFIG})):
        entry.write_text(damage)
        assert load_config(config, backends.known(), tmp_path, env).defaults.agent == "noop"


def test_data_json_cannot_hold_exactly_is_not_kept(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    text = "when: 2026-11-25\n1: one\n"
    data = parsed.parsed(tmp_path / "x.yaml", text, lambda t: {"when": object()}, env)
    assert "when" in data
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_a_remembered_fact_is_worked_out_again_when_its_key_changes(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert parsed.remembered("fact", ["a", 1], compute, env) == 1
    assert parsed.remembered("fact", ["a", 1], compute, env) == 1
    assert parsed.remembered("fact", ["a", 2], compute, env) == 2
    assert parsed.remembered("fact", ["a", 2], compute, {"RUN_AGENT_NO_CACHE": "1"}) == 3
