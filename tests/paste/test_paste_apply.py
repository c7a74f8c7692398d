"""Carrying out a reply's commands in a workspace, through the operations runtime, and the outboxes
that follow (compared with golden files)."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runagent.ops import Approvals
from runagent.ops.runtime import Runtime
from runagent.ops.waiting import Waiter
from runagent.paste.apply import INTERRUPTED, LISTING_LIMIT, Applied, Applier, workspace_listing
from runagent.paste.parser import parse
from runagent.paste.protocol import INSTRUCTIONS, Name, Result, render

GOLDEN = Path(__file__).parent.parent / "samples" / "paste"


def applier(
    tmp_path: Path, preset: str = "permissive", approvals: Approvals = Approvals.DENY
) -> Applier:
    (tmp_path / "ws").mkdir(exist_ok=True)
    runtime = Runtime.create(tmp_path / "run", tmp_path / "ws", preset, shell="/bin/sh")
    waiter = Waiter(runtime, lambda line: None, heartbeat=0.2)
    return Applier(runtime, lambda events: waiter.resolve(events, approvals))


def lines(results: tuple[Result, ...]) -> list[str]:
    return [r.lines()[0] for r in results]


def test_files_are_created_read_edited_and_deleted(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    done = a.apply(
        parse(
            '[CREATE_FILE path="src/deep/a.py"]\ndef f():\n    return 1\n[/CREATE_FILE]\n'
            '[CREATE_FILE path="old.txt"]\nold\n[/CREATE_FILE]\n'
            '[DELETE_FILE path="old.txt"]\n'
            '[READ_FILE path="src/deep/a.py"]\n'
            '[DELETE_FILE path="missing.txt"]\n'
            '[READ_FILE path="missing.txt"]\n'
        )
    )
    assert (ws / "src/deep/a.py").read_text() == "def f():\n    return 1"
    assert not (ws / "old.txt").exists()
    assert lines(done.results) == [
        "[OK] CREATE_FILE: Created 'src/deep/a.py'",
        "[OK] CREATE_FILE: Created 'old.txt'",
        "[OK] DELETE_FILE: Deleted 'old.txt'",
        "[OK] READ_FILE: Read 'src/deep/a.py' (21 bytes), shown under Requested File Contents",
        "[FAILED] DELETE_FILE: File 'missing.txt' not found",
        "[FAILED] READ_FILE: File 'missing.txt' not found",
    ]
    assert done.read_requests == ("src/deep/a.py",)
    # CREATE_FILE overwrites, as the spec says.
    a.apply(parse('[CREATE_FILE path="src/deep/a.py"]\nnew\n[/CREATE_FILE]'))
    assert (ws / "src/deep/a.py").read_text() == "new"


def test_two_edits_of_one_file_in_one_reply_are_numbered_as_the_spec_runs_them(
    tmp_path: Path,
) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "f.txt").write_text("".join(f"line{i}\n" for i in range(1, 11)))
    done = a.apply(
        parse(
            # Written to the spec (commands run in order): lines 2-3 become four lines, so
            # line5 is then line 7; once it is gone, line8-line9 are lines 9-10.
            '[EDIT_FILE path="f.txt" start_line="2" end_line="3"]\nA\nB\nC\nD\n[/EDIT_FILE]\n'
            '[EDIT_FILE path="f.txt" start_line="7" end_line="7"]\n[/EDIT_FILE]\n'
            '[EDIT_FILE path="f.txt" start_line="9" end_line="10"]\nE\n[/EDIT_FILE]\n'
            '[EDIT_FILE path="f.txt" start_line="1" end_line="1"]\nFIRST\n[/EDIT_FILE]\n'
        )
    )
    assert lines(done.results) == [
        "[OK] EDIT_FILE: Edited 'f.txt' lines 2-3",
        "[OK] EDIT_FILE: Edited 'f.txt' lines 7-7",
        "[OK] EDIT_FILE: Edited 'f.txt' lines 9-10",
        "[OK] EDIT_FILE: Edited 'f.txt' lines 1-1",
    ]
    assert (ws / "f.txt").read_text().split() == [
        "FIRST", "A", "B", "C", "D", "line4", "line6", "line7", "E", "line10",
    ]  # fmt: skip


def test_an_end_line_past_the_end_means_to_the_end_and_the_result_says_so(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "f.txt").write_text("1\n2\n3\n4\n")
    done = a.apply(
        parse(
            '[EDIT_FILE path="f.txt" start_line="2" end_line="3"]\nX\n[/EDIT_FILE]\n'
            '[EDIT_FILE path="f.txt" start_line="3" end_line="9"]\nY\nZ\n[/EDIT_FILE]\n'
            '[EDIT_FILE path="f.txt" start_line="5" end_line="9"]\nW\n[/EDIT_FILE]\n'
            '[EDIT_FILE path="nope.txt" start_line="1" end_line="1"]\nZ\n[/EDIT_FILE]\n'
        )
    )
    assert lines(done.results) == [
        "[OK] EDIT_FILE: Edited 'f.txt' lines 2-3",
        "[OK] EDIT_FILE: Edited 'f.txt' lines 3-3 (end_line 9 is past its last line, 3: "
        "replaced to the end)",
        "[FAILED] EDIT_FILE: start_line 5 is past the end of 'f.txt', which has 4 lines; nothing "
        "was changed (read it again for its line numbers)",
        "[FAILED] EDIT_FILE: File 'nope.txt' not found",
    ]
    assert (ws / "f.txt").read_text() == "1\nX\nY\nZ\n"


def test_a_delete_tag_with_text_after_it_deletes_nothing(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "x").write_text("kept\n")
    done = a.apply(parse('To delete a file, write:\n[DELETE_FILE path="x"] <- like this\n'))
    assert (ws / "x").read_text() == "kept\n"
    assert lines(done.results) == [
        "[FAILED] DELETE_FILE: [DELETE_FILE] has text after its tag ('<- like this'), so it is "
        "not a command and was not carried out; put a command's tag alone on its line (line 2)"
    ]


def test_an_attribute_given_twice_is_refused_with_a_failed_result_naming_it(
    tmp_path: Path,
) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "f.txt").write_text("1\n2\n3\n")
    done = a.apply(
        parse(
            '[EDIT_FILE path="f.txt" start_line="1" end_line="1" end_line="3"]\nX\n[/EDIT_FILE]\n'
            '[DELETE_FILE path="f.txt" path="g.txt"]\n'
        )
    )
    assert lines(done.results) == [
        '[FAILED] EDIT_FILE: [EDIT_FILE] gives the attribute end_line 2 times (end_line="1", '
        'end_line="3"), so it was not carried out; give each attribute once (line 1)',
        '[FAILED] DELETE_FILE: [DELETE_FILE] gives the attribute path 2 times (path="f.txt", '
        'path="g.txt"), so it was not carried out; give each attribute once (line 4)',
    ]
    assert (ws / "f.txt").read_text() == "1\n2\n3\n"


def test_an_edit_keeps_crlf_line_ends_and_a_missing_final_newline(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "w.txt").write_bytes(b"a\r\nb\r\nc\r\n")
    (ws / "n.txt").write_text("a\nb")
    a.apply(
        parse(
            '[EDIT_FILE path="w.txt" start_line="2" end_line="2"]\nB1\nB2\n[/EDIT_FILE]\n'
            '[EDIT_FILE path="n.txt" start_line="2" end_line="2"]\nB\n[/EDIT_FILE]\n'
        )
    )
    assert (ws / "w.txt").read_bytes() == b"a\r\nB1\r\nB2\r\nc\r\n"
    assert (ws / "n.txt").read_text() == "a\nB"


@pytest.mark.parametrize(
    "path", ["../escape.txt", "a/../../escape.txt", "/etc/passwd", "..", "link/escape.txt", "out/x"]
)
def test_a_path_out_of_the_workspace_is_rejected_and_nothing_is_written(
    tmp_path: Path, path: str
) -> None:
    a = applier(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "ws" / "link").symlink_to(outside)
    (tmp_path / "ws" / "out").symlink_to(outside)
    for text in (
        f'[CREATE_FILE path="{path}"]\nx\n[/CREATE_FILE]',
        f'[READ_FILE path="{path}"]',
        f'[DELETE_FILE path="{path}"]',
        f'[EDIT_FILE path="{path}" start_line="1" end_line="1"]\nx\n[/EDIT_FILE]',
    ):
        (result,) = a.apply(parse(text)).results
        assert not result.success
        assert result.summary.startswith("REJECTED: Path is outside workspace"), result
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists()


def test_an_absolute_path_inside_the_workspace_is_taken_as_relative(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = (tmp_path / "ws").resolve()
    (result,) = a.apply(parse(f'[CREATE_FILE path="{ws}/in.txt"]\nx\n[/CREATE_FILE]')).results
    assert result.success and (ws / "in.txt").exists()


def test_a_command_runs_with_sh_in_the_workspace_and_its_output_is_cut(tmp_path: Path) -> None:
    a = applier(tmp_path)
    done = a.apply(
        parse(
            "[RUN_COMMAND]\necho $0; pwd; echo err >&2\n[/RUN_COMMAND]\n"
            "[RUN_COMMAND]\nexit 3\n[/RUN_COMMAND]\n"
            "[RUN_COMMAND]\nhead -c 9000 /dev/zero | tr '\\0' x\n[/RUN_COMMAND]\n"
        )
    )
    first, failed, long = done.results
    assert first.success and first.summary == "Ran 'echo $0; pwd; echo err >&2' (exit code 0)"
    assert first.output == f"/bin/sh\n{(tmp_path / 'ws').resolve()}\n\nerr\n"
    assert not failed.success and failed.summary == "Ran 'exit 3' (exit code 3)"
    assert long.output is not None
    assert long.output.startswith("x" * 4000 + "\n[output cut: 9000 characters, the first 4000")


def test_a_denied_command_is_a_failed_result_saying_why(tmp_path: Path) -> None:
    a = applier(tmp_path, preset="standard")
    (result,) = a.apply(parse("[RUN_COMMAND]\nsudo rm -rf /\n[/RUN_COMMAND]")).results
    assert not result.success
    assert result.summary.startswith("'sudo rm -rf /' is not allowed: ")


def test_a_command_that_needs_approval_waits_for_the_person(tmp_path: Path) -> None:
    a = applier(tmp_path, preset="standard", approvals=Approvals.WAIT)
    runtime = a.runtime
    answered = threading.Event()

    def person() -> None:  # another process would; the runtime's files are the same
        deadline = time.monotonic() + 10
        while (waiting := runtime.pending) is None:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        other = Runtime.open(runtime.paths.folder)
        other.receive({"approval": {"operationId": waiting.operation_id, "decision": "approved"}})
        answered.set()

    helper = threading.Thread(target=person)
    helper.start()
    # The standard policy asks before a recursive delete.
    (result,) = a.apply(
        parse("[RUN_COMMAND]\nmkdir d && rm -r d && echo ran\n[/RUN_COMMAND]")
    ).results
    helper.join(10)
    assert answered.is_set()
    assert result.success, result
    assert result.output == "ran\n"


def test_each_command_of_a_reply_gets_its_own_operation_id(tmp_path: Path) -> None:
    # An answer to one pause can then never approve another command that paused later.
    a = applier(tmp_path)
    a.apply(parse("[RUN_COMMAND]\ntrue\n[/RUN_COMMAND]\n[MESSAGE]\nx\n[/MESSAGE]"), ids="seq4")
    sent = [
        json.loads(line)["message"]["operations"][0]["id"]
        for line in a.runtime.paths.operations.read_text().splitlines()
    ]
    assert sent == ["seq4-1", "seq4-2"]


def test_a_reply_resumed_after_a_restart_runs_only_what_had_not_begun(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "f.txt").write_text("1\n2\n3\n")
    reply = parse(
        '[EDIT_FILE path="f.txt" start_line="1" end_line="1"]\nA\nB\n[/EDIT_FILE]\n'
        "[RUN_COMMAND]\necho ran >> log.txt\n[/RUN_COMMAND]\n"
        '[EDIT_FILE path="f.txt" start_line="4" end_line="4"]\nC\n[/EDIT_FILE]\n'
    )
    seen: list[Applied] = []
    a.apply(reply[:1], checkpoint=seen.append)
    # As if killed while the command ran: the edit finished, the command was begun.
    begun = Applied.from_dict(json.loads(json.dumps(seen[-1].to_dict())))
    begun = dataclasses.replace(begun, started=2)
    done = applier(tmp_path).apply(reply, resume=begun)
    assert [r.lines()[0] for r in done.results] == [
        "[OK] EDIT_FILE: Edited 'f.txt' lines 1-1",
        f"[FAILED] RUN_COMMAND: {INTERRUPTED}",
        "[OK] EDIT_FILE: Edited 'f.txt' lines 4-4",
    ]
    assert not (ws / "log.txt").exists()  # the interrupted command is not run again
    # The first edit is not applied twice: the last range refers to the file as it left it.
    assert (ws / "f.txt").read_text() == "A\nB\n2\nC\n"


def test_an_edit_through_a_link_sees_what_an_edit_by_the_file_name_left(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "f.txt").write_text("1\n2\n3\n4\n5\n")
    (ws / "link.txt").symlink_to("f.txt")
    a.apply(
        parse(
            '[EDIT_FILE path="f.txt" start_line="1" end_line="1"]\nA\nB\nC\n[/EDIT_FILE]\n'
            '[EDIT_FILE path="link.txt" start_line="7" end_line="7"]\nFIVE\n[/EDIT_FILE]\n'
        )
    )
    assert (ws / "f.txt").read_text().split() == ["A", "B", "C", "2", "3", "4", "FIVE"]


def test_after_a_command_line_numbers_refer_to_what_it_left(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "f.txt").write_text("1\n2\n3\n")
    a.apply(
        parse(
            '[EDIT_FILE path="f.txt" start_line="1" end_line="1"]\nA\nB\n[/EDIT_FILE]\n'
            "[RUN_COMMAND]\nprintf '0\\n' | cat - f.txt > g && mv g f.txt\n[/RUN_COMMAND]\n"
            '[EDIT_FILE path="f.txt" start_line="1" end_line="1"]\nZERO\n[/EDIT_FILE]\n'
        )
    )
    assert (ws / "f.txt").read_text().split() == ["ZERO", "A", "B", "2", "3"]


def test_an_edit_of_one_empty_line_puts_in_an_empty_line(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "f.txt").write_text("1\n2\n3\n")
    a.apply(parse('[EDIT_FILE path="f.txt" start_line="2" end_line="2"]\n\n[/EDIT_FILE]'))
    assert (ws / "f.txt").read_text() == "1\n\n3\n"
    a.apply(parse('[CREATE_FILE path="blank.txt"]\n\n[/CREATE_FILE]'))
    assert (ws / "blank.txt").read_text() == ""  # one empty line, joined: as CodingAgent


def test_a_path_naming_a_folder_or_too_long_is_refused_and_shown_short(tmp_path: Path) -> None:
    a = applier(tmp_path)
    folder, long = a.apply(
        parse(f'[CREATE_FILE path="sub/"]\nx\n[/CREATE_FILE]\n[READ_FILE path="{"d/" * 3000}x"]')
    ).results
    assert folder.summary == "the path 'sub' names a folder; name a file"
    assert not (tmp_path / "ws" / "sub").exists()
    assert not long.success and len(long.summary) < 300


def test_a_message_is_shown_and_done_ends_the_reply(tmp_path: Path) -> None:
    a = applier(tmp_path)
    shown: list[str] = []
    a.show = shown.append
    done = a.apply(
        parse(
            "[MESSAGE]\nHello\n  there\n[/MESSAGE]\n[DONE]\nAll done.\n[/DONE]\n"
            '[CREATE_FILE path="late.txt"]\nx\n[/CREATE_FILE]\n'
        )
    )
    assert shown == ["Hello\n  there"]
    assert done.summary == "All done."
    assert done.ignored_after_done == 1
    assert not (tmp_path / "ws" / "late.txt").exists()


def test_the_listing_is_sorted_skips_git_and_links_and_is_cut(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("x")
    (ws / "b.txt").write_text("bb")
    (ws / "a").mkdir()
    (ws / "a" / "z.txt").write_text("z")
    os.symlink("/etc", ws / "etc")
    listing = workspace_listing(ws)
    assert [(f.path, f.size) for f in listing.files] == [("a/z.txt", 1), ("b.txt", 2)]
    assert listing.note == "the .git folder is not listed"
    for i in range(LISTING_LIMIT + 7):
        (ws / "a" / f"f{i:04d}").write_text("")
    cut = workspace_listing(ws)
    assert len(cut.files) == LISTING_LIMIT and cut.left_out == 9


def test_every_outbox_repeats_the_same_instructions() -> None:
    from runagent.paste.protocol import Listing

    first = render(
        session_id="a1b2c3d4", sequence=1, task="t", listing=Listing(()), results=(), requested=()
    )
    later = render(
        session_id="a1b2c3d4", sequence=7, task="t", listing=Listing(()), results=(), requested=()
    )
    assert first.split("=== PROTOCOL ===\n")[1].split("\n\n=== CONTEXT")[0] == INSTRUCTIONS
    assert later.split("=== PROTOCOL ===\n")[1].split("\n\n=== CONTEXT")[0] == INSTRUCTIONS


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RUN_AGENT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; RUN_AGENT_UPDATE_GOLDEN=1 rewrites it"


def test_the_first_and_a_later_outbox_match_the_golden_files(tmp_path: Path) -> None:
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    task = "Create a calculator app in Python\nwith tests."
    first = render(
        session_id="a1b2c3d4", sequence=1, task=task, listing=a.listing(), results=(),
        requested=(),
    )  # fmt: skip
    golden("outbox-seq0001.txt", first)
    (ws / "tests").mkdir()
    (ws / "tests" / "test_calc.py").write_text("from calc import add\n\nassert add(1, 2) == 3\n")
    done = a.apply(
        parse(
            "Sure, here is the calculator.\n"
            '[CREATE_FILE path="calc.py"]\ndef add(a, b):\n    return a + b\n[/CREATE_FILE]\n'
            "[RUN_COMMAND]\nexpr 2 + 3\n[/RUN_COMMAND]\n"
            '[EDIT_FILE path="missing.py" start_line="1" end_line="1"]\nx\n[/EDIT_FILE]\n'
            '[CREATE_FILE path="../outside.py"]\nx\n[/CREATE_FILE]\n'
            '[READ_FILE path="tests/test_calc.py"]\n'
            '[EDIT_FILE path="calc.py" start_line="x" end_line="2"]\ny\n[/EDIT_FILE]\n'
        )
    )
    later = render(
        session_id="a1b2c3d4", sequence=2, task=task, listing=a.listing(),
        results=done.results, requested=a.requested(done.read_requests),
    )  # fmt: skip
    golden("outbox-seq0002.txt", later)


PIECES = [
    '[CREATE_FILE path="a.txt"]', '[CREATE_FILE path="../out.txt"]', "[/CREATE_FILE]",
    '[EDIT_FILE path="a.txt" start_line="1" end_line="2"]',
    '[EDIT_FILE path="a.txt" start_line="3" end_line="3"]', "[/EDIT_FILE]",
    '[DELETE_FILE path="a.txt"]', '[READ_FILE path="a.txt"]', '[READ_FILE path="/etc/passwd"]',
    '[CREATE_FILE path="link/x"]', '[CREATE_FILE path="d/\\u0000"]', '[CREATE_FILE path="a..b"]',
    "[MESSAGE]", "[/MESSAGE]", "[DONE]", "[/DONE]", "\n", "\r\n", "x", "```", "\u201c",
]  # fmt: skip


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=25))
def test_no_reply_makes_the_applier_raise_or_write_outside(
    tmp_path: Path, parts: list[str]
) -> None:
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    (base / "outside").mkdir()
    a = applier(base)
    (base / "ws" / "link").symlink_to(base / "outside")
    # No RUN_COMMAND: random text is not run as a command on this machine.
    items = [i for i in parse("".join(parts)) if getattr(i, "name", None) is not Name.RUN_COMMAND]
    done = a.apply(items)
    assert all(isinstance(r, Result) for r in done.results)
    assert list((base / "outside").iterdir()) == []
    assert sorted(p.name for p in base.iterdir()) == ["outside", "run", "ws"]
    a.requested(done.read_requests)


def test_a_path_with_a_line_break_character_is_refused(tmp_path: Path) -> None:
    a = applier(tmp_path)
    for bad in ("q\u2028outbox 9 ready", "a\x0bb", "c\x85d"):
        (result,) = a.apply(parse(f'[CREATE_FILE path="{bad}"]\nx\n[/CREATE_FILE]')).results
        assert "holds a control or line-break character" in result.summary
    assert list((tmp_path / "ws").iterdir()) == []


def test_an_empty_file_is_not_edited_by_line(tmp_path: Path) -> None:
    a = applier(tmp_path)
    (tmp_path / "ws" / "empty.txt").write_text("")
    (result,) = a.apply(
        parse('[EDIT_FILE path="empty.txt" start_line="1" end_line="1"]\nx\n[/EDIT_FILE]')
    ).results
    assert result.summary == (
        "'empty.txt' is empty: it has no lines to replace; write it with CREATE_FILE"
    )


def test_a_reply_of_more_commands_than_the_limit_runs_the_first_ones(tmp_path: Path) -> None:
    from runagent.paste.apply import MAX_COMMANDS, TOO_MANY

    a = applier(tmp_path)
    saves: list[Applied] = []
    done = a.apply(parse("[MESSAGE]m[/MESSAGE]\n" * (MAX_COMMANDS + 3)), checkpoint=saves.append)
    assert [r.summary for r in done.results[-4:]] == ["Shown to the user"] + [TOO_MANY] * 3
    assert saves == []  # messages change nothing: no progress is saved around them


def test_where_the_spec_is_silent_a_reply_reads_as_codingagents_parser_reads_it(
    tmp_path: Path,
) -> None:
    """Three replies CodingAgent's own parser read otherwise (docs/guides/paste.md, "Reading
    the spec"): a file is the lines between the tags joined by line breaks, with none added at
    its end; a tag line with text after its tag and no closing tag is no command, and what
    follows it is read on."""
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    a.apply(parse('[CREATE_FILE path="a.txt"]\none\ntwo\n[/CREATE_FILE]'))
    assert (ws / "a.txt").read_bytes() == b"one\ntwo"  # as CodingAgent writes it
    a.apply(parse('[CREATE_FILE path="b.txt"]\none\ntwo\n\n[/CREATE_FILE]'))
    assert (ws / "b.txt").read_bytes() == b"one\ntwo\n"  # an empty last line: a final newline
    a.apply(parse('[CREATE_FILE path="c.txt"]\n[/CREATE_FILE]'))
    assert (ws / "c.txt").read_bytes() == b""
    done = a.apply(parse(
        '[DONE] All tasks complete.\n[CREATE_FILE path="after.txt"]\nx\n[/CREATE_FILE]\n'
        "[MESSAGE]\nhi\n[/MESSAGE]\n"
    ))  # fmt: skip
    assert (ws / "after.txt").read_bytes() == b"x" and done.messages == ("hi",)
    assert done.summary is None  # no DONE was sent: the task goes on
    assert lines(done.results)[0] == (
        "[FAILED] DONE: [DONE] has text after its tag ('All tasks complete.') and no [/DONE] "
        "follows, so it is not a command and was not carried out; put the tag alone on its "
        "line, the text on the lines after it, then [/DONE] (line 1)"
    )


def test_an_edit_with_an_empty_body_removes_its_lines_as_the_spec_says(tmp_path: Path) -> None:
    """The spec: the range is removed and the replacement (here none) put in its place.
    CodingAgent leaves one empty line there; one empty line between the tags does that here."""
    a = applier(tmp_path)
    ws = tmp_path / "ws"
    (ws / "f.txt").write_text("1\n2\n3\n4\n")
    a.apply(parse('[EDIT_FILE path="f.txt" start_line="2" end_line="3"]\n[/EDIT_FILE]'))
    assert (ws / "f.txt").read_text() == "1\n4\n"
    a.apply(parse('[EDIT_FILE path="f.txt" start_line="1" end_line="1"]\n\n[/EDIT_FILE]'))
    assert (ws / "f.txt").read_text() == "\n4\n"
