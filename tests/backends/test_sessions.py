"""The claude, codex and gemini backends read the agent's session id from its own events (the
real streams captured from the CLIs), resume exactly that session by id, and tell a resume the
CLI refused (the session gone) from any other failure."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from runagent.loop.backend import session_token
from tests.backends.test_parsers import backend, context_for

# The session each captured stream started (its first event says so).
STARTED = {
    "claude-text": "c05eb71d-26d5-4712-9833-93c30f98c11c",
    "claude-tool": "a26c1fc8-0fcd-4549-b8ee-df4ce31b9a89",
    "claude-error": "5365e519-6efa-44dc-8204-c952160f2c36",
    "codex-text": "01a20302-873e-7381-98ad-557e50499f3b",
    "codex-tool": "01a20302-88a6-7b03-917e-8fe1ac0bba23",
    "codex-error": "01a20302-8a1e-74e1-aa5e-ab080c6cbe27",
    "gemini-text": "0647af10-0254-4480-bf3c-8d8570e5902f",
    "gemini-tool": "16120f7f-8931-41a2-aff7-2adb468d6d81",
}
# gemini keeps no session whose first request failed: that one is not to be resumed.
UNKEPT = ["gemini-error"]
UNKEPT_ID = "b4fdac0e-6d9d-4eb3-be1f-b54ec3949e0d"  # its id
# The session each captured refusal was asked to resume, and the CLI's exit code.
GONE = {
    "claude": ("77f3a8ed-8298-4c52-ace9-15ade212a001", 1),
    "codex": ("12232db5-05f8-4321-8b67-dea6343ef995", 1),
    "gemini": ("b4bd477e-13c6-4606-8e81-76d1e959c270", 42),
}


@pytest.mark.parametrize("sample", sorted(STARTED))
def test_the_session_id_is_read_from_the_agents_own_events(tmp_path: Path, sample: str) -> None:
    name = sample.split("-")[0]
    assert backend(name).resumes_sessions
    assert backend(name).session_id(context_for(tmp_path, sample)) == STARTED[sample]


@pytest.mark.parametrize("sample", UNKEPT)
def test_a_session_the_cli_did_not_keep_is_not_recorded(tmp_path: Path, sample: str) -> None:
    assert backend(sample.split("-")[0]).session_id(context_for(tmp_path, sample)) is None


@pytest.mark.parametrize("name", sorted(GONE))
def test_a_resume_the_cli_refused_is_told_with_its_words(tmp_path: Path, name: str) -> None:
    session, code = GONE[name]
    ctx = dataclasses.replace(context_for(tmp_path, f"{name}-resume-gone"), session=session)
    agent = backend(name)
    assert agent.session_id(ctx) is None  # it started none
    words = agent.session_refused(ctx, code)
    assert words is not None and session in words
    assert agent.session_refused(ctx, 0) is None


@pytest.mark.parametrize("name", sorted(GONE))
def test_a_resumed_run_that_failed_in_its_session_was_not_refused(
    tmp_path: Path, name: str
) -> None:
    ctx = context_for(tmp_path, f"{name}-error")  # the API failed, in the session it resumed
    ctx = dataclasses.replace(ctx, session=STARTED.get(f"{name}-error", UNKEPT_ID))
    assert backend(name).session_refused(ctx, 1) is None
    assert backend(name).session_id(ctx) == ctx.session  # still the one to continue
    (tmp_path / "b").mkdir()
    fresh = dataclasses.replace(context_for(tmp_path / "b", f"{name}-resume-gone"), session=None)
    assert backend(name).session_refused(fresh, 1) is None  # it was asked to resume none


def test_a_session_id_that_could_be_an_option_or_a_path_is_not_kept() -> None:
    assert session_token("c05eb71d-26d5-4712-9833-93c30f98c11c")
    for bad in ["--config=x", "-x1234567", "../../etc/x", "a b c d e f", "short", "x" * 200,
                "id\nline", 12345678, None]:  # fmt: skip
        assert session_token(bad) is None, bad


@pytest.mark.parametrize(
    ("name", "resumed"),
    [("claude", ["--resume", "SID-0000-1111"]), ("gemini", ["--resume", "SID-0000-1111"])],
)
def test_claude_and_gemini_resume_exactly_that_session(
    tmp_path: Path, name: str, resumed: list[str]
) -> None:
    ctx = context_for(tmp_path, f"{name}-text")
    argv = list(backend(name).launch(ctx).argv)
    assert "--resume" not in argv and "--continue" not in argv and "-c" not in argv
    argv = list(backend(name).launch(dataclasses.replace(ctx, session="SID-0000-1111")).argv)
    at = argv.index("--resume")
    assert argv[at : at + 2] == resumed
    assert "latest" not in argv and "--continue" not in argv


def test_codex_resumes_exactly_that_thread(tmp_path: Path) -> None:
    ctx = dataclasses.replace(context_for(tmp_path, "codex-text"), session="SID-0000-1111")
    argv = list(backend("codex").launch(ctx).argv)
    assert argv[1:3] == ["exec", "resume"]
    assert argv[-2:] == ["SID-0000-1111", "-"]  # the id, then the prompt from stdin
    assert "--last" not in argv and "--json" in argv
