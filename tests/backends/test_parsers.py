"""Backends read the real streams of claude, codex and gemini (samples captured from the CLIs)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

import backends
from runagent.config.settings import AgentConfig
from runagent.loop.backend import Backend
from runagent.loop.context import RunContext
from runagent.store.runfolder import RunPaths, TaskPaths
from runagent.store.runinfo import Reason

SAMPLES = Path(__file__).parent.with_name("samples")
TASK = TaskPaths(Path("/runs"), "p", "t")  # parsers read only the run's own files


def context_for(tmp_path: Path, sample: str) -> RunContext:
    """A run folder whose stdout/stderr are the captured sample `sample`."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(SAMPLES / f"{sample}.stdout.jsonl", run / "agent-stdout.txt")
    stderr = SAMPLES / f"{sample}.stderr.txt"
    if stderr.exists():
        shutil.copy(stderr, run / "agent-stderr.txt")
    else:
        (run / "agent-stderr.txt").touch()
    return RunContext("r", TASK, "x", tmp_path, RunPaths(run), {})


def backend(name: str) -> Backend:
    return backends.create(AgentConfig(name, name))


@pytest.mark.parametrize(
    "sample",
    ["claude-text", "claude-tool", "claude-tool-partial", "claude-tool-denied",
     "codex-text", "codex-tool", "gemini-text", "gemini-tool"],
)  # fmt: skip
def test_the_final_answer_is_parsed_from_the_stream(tmp_path: Path, sample: str) -> None:
    ctx = context_for(tmp_path, sample)
    assert backend(sample.split("-")[0]).final_output(ctx) == "hello from fake model\n"


@pytest.mark.parametrize("name", ["claude", "codex", "gemini"])
def test_an_api_error_is_diagnosed_from_the_stream(tmp_path: Path, name: str) -> None:
    ctx = context_for(tmp_path, f"{name}-error")
    exit_code = {"claude": 1, "codex": 1, "gemini": 144}[name]
    diagnosis = backend(name).diagnose(ctx, exit_code)
    assert diagnosis is not None
    assert diagnosis.reason is Reason.API_ERROR
    assert "injected error 400" in diagnosis.message


def test_claude_error_result_is_an_error_despite_subtype_success(tmp_path: Path) -> None:
    ctx = context_for(tmp_path, "claude-error")
    text = (SAMPLES / "claude-error.stdout.jsonl").read_text()
    assert '"subtype":"success"' in text and '"is_error":true' in text
    diagnosis = backend("claude").diagnose(ctx, 1)
    assert diagnosis is not None and "HTTP 400" in diagnosis.message


def test_a_stream_with_nothing_to_parse_leaves_output_to_stdout(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "agent-stdout.txt").write_text("plain text, no events\n")
    ctx = RunContext("r", TASK, "x", tmp_path, RunPaths(run), {})
    for name in ("claude", "codex", "gemini"):
        assert backend(name).final_output(ctx) is None  # the supervisor copies stdout


def write_stream(tmp_path: Path, lines: list[str], stderr: str = "") -> RunContext:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "agent-stdout.txt").write_text("\n".join(lines) + "\n")
    (run / "agent-stderr.txt").write_text(stderr)
    return RunContext("r", TASK, "x", tmp_path, RunPaths(run), {})


def test_claude_rate_limit_event_gives_the_reset_time(tmp_path: Path) -> None:
    resets = int(time.time()) + 3600
    ctx = write_stream(
        tmp_path,
        [
            '{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","resetsAt":1}}',
            '{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":'
            f'{resets},"rateLimitType":"five_hour"}}}}',
            '{"type":"result","subtype":"success","is_error":true,'
            '"result":"You\'ve hit your limit"}',
        ],
    )
    diagnosis = backend("claude").diagnose(ctx, 1)
    assert diagnosis is not None and diagnosis.reason is Reason.RATE_LIMIT
    assert diagnosis.retry_after is not None and 3590 < diagnosis.retry_after <= 3600
    assert "five_hour" in diagnosis.message


def test_claude_not_logged_in_is_authentication(tmp_path: Path) -> None:
    ctx = write_stream(
        tmp_path,
        ['{"type":"result","subtype":"success","is_error":true,'
         '"result":"Not logged in · Please run /login"}'],
    )  # fmt: skip
    diagnosis = backend("claude").diagnose(ctx, 1)
    assert diagnosis is not None and diagnosis.reason is Reason.AUTH


def test_a_torn_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    ctx = write_stream(
        tmp_path,
        ['{"type":"assistant","message":{"content":[{"type":"text","text":"partial{"type":"rat',
         '{"type":"result","is_error":false,"result":"final answer"}'],
    )  # fmt: skip
    assert backend("claude").final_output(ctx) == "final answer\n"


def test_codex_usage_limit_is_a_rate_limit_with_its_reset(tmp_path: Path) -> None:
    body = (
        '{\\"type\\":\\"error\\",\\"error\\":{\\"type\\":\\"usage_limit_reached\\",'
        '\\"message\\":\\"The usage limit has been reached\\",\\"resets_in_seconds\\":13872},'
        '\\"status_code\\":429}'
    )
    ctx = write_stream(tmp_path, [f'{{"type":"turn.failed","error":{{"message":"{body}"}}}}'])
    diagnosis = backend("codex").diagnose(ctx, 1)
    assert diagnosis is not None and diagnosis.reason is Reason.RATE_LIMIT
    assert diagnosis.retry_after == 13872


@pytest.mark.parametrize(
    ("said", "zone", "lifts"),
    [
        ("try again at 5:46 AM.", "UTC", 3650.0),  # today: the time only, to the minute
        ("try again at 11:16 AM.", "Asia/Kolkata", 3650.0),  # in the agent's TZ
        ("try again at Nov 29th, 2026 5:46 AM.", "UTC", 90050.0),  # another day: with its date
        ("try again at 12:05 AM.", "UTC", 0.0),  # a minute gone by already
        ("try again later.", "UTC", None),  # no reset known: rate_limit_wait
    ],
)
def test_codex_usage_limit_lifts_when_its_message_says(
    tmp_path: Path, said: str, zone: str, lifts: float | None
) -> None:
    """codex 0.169 turns the provider's 429 usage_limit_reached into its own words, the reset
    in the local time of its process to the minute (its turn.failed event, as the real CLI
    wrote it against tests/fake_models.py's usage_limit)."""
    from backends.codex import try_again_at

    message = (
        "You\u2019ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/"
        f"pro), visit https://chatgpt.com/settings/usage to purchase more credits or {said}"
    )
    from datetime import UTC, datetime

    now = datetime(2026, 11, 28, 4, 46, 10, tzinfo=UTC).timestamp()
    assert try_again_at(message, zone, now) == lifts
    ctx = write_stream(tmp_path, [json.dumps({"type": "turn.failed",
                                              "error": {"message": message}})])  # fmt: skip
    diagnosis = backend("codex").diagnose(ctx, 1)
    assert diagnosis is not None and diagnosis.reason is Reason.RATE_LIMIT
    assert "hit your usage limit" in diagnosis.message


def test_codex_missing_key_is_authentication(tmp_path: Path) -> None:
    ctx = write_stream(
        tmp_path,
        ['{"type":"turn.failed","error":{"message":"Missing environment variable: `KEY`."}}'],
    )
    diagnosis = backend("codex").diagnose(ctx, 1)
    assert diagnosis is not None and diagnosis.reason is Reason.AUTH


def test_gemini_exit_codes_carry_the_http_status(tmp_path: Path) -> None:
    message = (
        '[API Error: {"error":{"code":429,"status":"RESOURCE_EXHAUSTED",'
        '"details":[{"retryDelay":"12s"}]}}]'
    )
    event = {"type": "result", "status": "error", "error": {"message": message}}
    import json

    ctx = write_stream(tmp_path, [json.dumps(event)])
    diagnosis = backend("gemini").diagnose(ctx, 173)
    assert diagnosis is not None and diagnosis.reason is Reason.RATE_LIMIT
    assert diagnosis.retry_after == 12
    auth = backend("gemini").diagnose(write_stream(tmp_path, [], "Invalid auth method"), 41)
    assert auth is not None and auth.reason is Reason.AUTH


def test_a_timeout_is_never_read_as_a_rate_limit(tmp_path: Path) -> None:
    """Text patterns apply to error text only: the model discussing 429s is not a rate limit."""
    ctx = write_stream(
        tmp_path,
        ['{"type":"assistant","message":{"content":[{"type":"text",'
         '"text":"handle HTTP 429 rate limit"}]}}'],
        stderr="",
    )  # fmt: skip
    assert backend("claude").diagnose(ctx, 124) is None


def test_summaries_are_readable(tmp_path: Path) -> None:
    lines = (SAMPLES / "claude-tool.stdout.jsonl").read_text().splitlines()
    summaries = [s for s in map(backend("claude").summarize, lines) if s]
    assert any(s.startswith("[Bash]") for s in summaries)
    assert "hello from fake model" in summaries


@pytest.mark.parametrize(
    ("sample", "tokens_in", "tokens_out", "cost"),
    [("claude-text", 10, 5, 0.00014), ("claude-tool", 20, 10, 0.00028),
     ("codex-text", 10, 5, None), ("codex-tool", 20, 10, None),
     ("gemini-text", 20, 10, None), ("gemini-tool", 30, 15, None)],
)  # fmt: skip
def test_usage_and_cost_are_read_from_the_stream(
    tmp_path: Path, sample: str, tokens_in: int, tokens_out: int, cost: float | None
) -> None:
    used = backend(sample.split("-")[0]).usage(context_for(tmp_path, sample))
    assert used is not None
    assert (used.tokens_in, used.tokens_out) == (tokens_in, tokens_out)
    assert used.cost_usd == pytest.approx(cost) if cost is not None else used.cost_usd is None


def test_claude_usage_before_its_result_counts_each_message_once(tmp_path: Path) -> None:
    """Mid-run (what a budget reads), a claude stream has said only its assistant messages'
    usage, each repeated on every event of its content: each message counts once, at the most
    it said; the result, when it comes, is the run's whole usage and cost."""
    lines = (SAMPLES / "claude-tool.stdout.jsonl").read_text().splitlines()
    before_result = [line for line in lines if '"type":"result"' not in line.replace(" ", "")]
    assert len(before_result) < len(lines)
    message = {"id": "msg_x", "usage": {"input_tokens": 7, "cache_read_input_tokens": 1000,
                                        "output_tokens": 3}}  # fmt: skip
    again = {"id": "msg_x", "usage": {"input_tokens": 7, "cache_read_input_tokens": 1000,
                                      "output_tokens": 40}}  # fmt: skip
    extra = [json.dumps({"type": "assistant", "message": m}) for m in (message, message, again)]
    ctx = write_stream(tmp_path, before_result + extra)
    used = backend("claude").usage(ctx)
    assert used is not None and used.cost_usd is None
    # The sample's two messages (10 in, 1 out each) and msg_x once, at its last word: 40 out.
    assert (used.tokens_in, used.tokens_out) == (20 + 1007, 2 + 40)
    (result,) = [line for line in lines if line not in before_result]
    used = backend("claude").usage(write_stream(tmp_path, [*before_result, *extra, result]))
    assert used is not None and (used.tokens_in, used.tokens_out) == (20, 10)
    assert used.cost_usd == pytest.approx(0.00028)


@pytest.mark.parametrize(
    "line",
    ['{"type":"result","usage":"lots","total_cost_usd":"free"}',
     '{"type":"result","usage":{"input_tokens":-5,"output_tokens":true},"total_cost_usd":-1}',
     '{"type":"turn.completed","usage":null}', '{"type":"result","stats":[1,2]}'],
)  # fmt: skip
def test_a_stream_that_lies_about_usage_counts_nothing(tmp_path: Path, line: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "agent-stdout.txt").write_text(line + "\n")
    (run / "agent-stderr.txt").touch()
    ctx = RunContext("r", TASK, "x", tmp_path, RunPaths(run), {})
    for name in ("claude", "codex", "gemini"):
        used = backend(name).usage(ctx)
        assert used is None or (used.tokens_in, used.tokens_out, used.cost_usd) in ((0, 0, None),)
