"""A stdout line read in words by the rules its backend states, in Python as the page reads it
in JavaScript (the fleet's last line of a running task): the real CLIs' sample streams."""

from __future__ import annotations

from pathlib import Path

import pytest

import backends
from runagent.loop import lines

SAMPLES = Path(__file__).resolve().parents[1] / "samples"  # the real CLIs' captured streams


@pytest.mark.parametrize(
    ("backend", "line", "words"),
    [
        (
            "codex",
            '{"type":"item.completed","item":{"id":"i","type":"agent_message",'
            '"text":"hello from\\n fake model"}}',
            "hello from fake model",
        ),
        (
            "claude",
            '{"type":"result","subtype":"success","is_error":false,"result":"done it"}',
            "done it",
        ),
        ("claude", "not json at all", "not json at all"),
        ("gemini", '{"type":"unknown-event"}', "unknown-event"),
        ("command", '{"a": 1}', '{"a": 1}'),
    ],
)
def test_a_line_reads_as_its_backend_says(backend: str, line: str, words: str) -> None:
    assert words in lines.read(line, lines.checked(backends.lines_of(backend), backend))


def test_every_line_of_the_real_samples_reads_without_failing() -> None:
    found = sorted(SAMPLES.glob("*.stdout.jsonl"))
    assert len(found) >= 9  # claude's, codex's and gemini's
    read = 0
    for path in found:
        backend = path.name.split("-")[0]
        rules = lines.checked(backends.lines_of(backend), backend)
        for line in path.read_text().splitlines():
            said = lines.read(line, rules)
            assert "\n" not in said
            read += said != line  # read in words, not shown as written
    assert read > 20
