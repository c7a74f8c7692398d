"""The inbox: which reply files are taken, in which order, and when they count as whole."""

from __future__ import annotations

import os
from pathlib import Path

from runagent.paste import inbox


def test_replies_are_taken_oldest_first_once_unchanged_for_the_settle_time(tmp_path: Path) -> None:
    for name, mtime in (("b.txt", 100), ("a.txt", 200), ("c.txt", 50)):
        (tmp_path / name).write_text(name)
        os.utime(tmp_path / name, (mtime, mtime))
    (tmp_path / "writing.txt").write_text("half")
    os.utime(tmp_path / "writing.txt", (299.5, 299.5))  # changed half a second ago
    files, unsettled = inbox.ready(tmp_path, now=300)
    assert [p.name for p in files] == ["c.txt", "b.txt", "a.txt"]
    assert unsettled
    files, unsettled = inbox.ready(tmp_path, now=300 + inbox.SETTLE)
    assert [p.name for p in files][-1] == "writing.txt" and not unsettled


def test_hidden_files_other_names_folders_and_links_are_not_replies(tmp_path: Path) -> None:
    (tmp_path / ".reply.txt").write_text("x")  # a writer's temporary file
    (tmp_path / "reply.txt.tmp").write_text("x")
    (tmp_path / "notes.md").write_text("x")
    (tmp_path / "dir.txt").mkdir()
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_text("do not read")
    (tmp_path / "link.txt").symlink_to(secret)
    assert inbox.ready(tmp_path, now=10**10) == ([], False)
    assert inbox.read(tmp_path / "link.txt").text is None  # and never read through a link
    secret.unlink()


def test_a_reply_that_is_not_a_regular_file_or_too_large_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.txt")
    refused = inbox.read(tmp_path / "fifo.txt")
    assert refused.text is None and refused.problem == "it is not a regular file"
    with open(tmp_path / "big.txt", "wb") as f:
        f.truncate(inbox.MAX_REPLY + 1)
    big = inbox.read(tmp_path / "big.txt")
    assert big.text is None and big.problem == f"it is larger than {inbox.MAX_REPLY} bytes"
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 [DONE]")
    assert inbox.read(tmp_path / "latin1.txt").text == "caf\ufffd [DONE]"


def test_moving_aside_never_replaces_an_earlier_reply(tmp_path: Path) -> None:
    done = tmp_path / "processed"
    for text in ("first", "second"):
        (tmp_path / "r.txt").write_text(text)
        inbox.move_aside(tmp_path / "r.txt", done, "abcd1234_seq0001")
    assert sorted(p.read_text() for p in done.iterdir()) == ["first", "second"]


def test_a_reply_dated_ahead_of_this_clock_is_taken(tmp_path: Path) -> None:
    (tmp_path / "skewed.txt").write_text("x")
    os.utime(tmp_path / "skewed.txt", (10_000, 10_000))  # an hour ahead of "now" below
    assert inbox.ready(tmp_path, now=6_400) == ([tmp_path / "skewed.txt"], False)


def test_a_utf16_reply_from_a_windows_editor_is_read_as_text(tmp_path: Path) -> None:
    text = '[CREATE_FILE path="caf\u00e9.txt"]\r\nx\r\n[/CREATE_FILE]\r\n'
    (tmp_path / "le.txt").write_bytes(text.encode("utf-16"))  # with its byte-order mark
    (tmp_path / "be.txt").write_bytes(b"\xfe\xff" + text.encode("utf-16-be"))
    assert inbox.read(tmp_path / "le.txt").text == text
    assert inbox.read(tmp_path / "be.txt").text == text
