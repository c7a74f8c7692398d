"""Paste runs end to end: a real `run-agent --agent paste` loop, and a scripted person who reads
the outboxes and drops replies into the inbox (or hands them in with `run-agent paste reply`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import yaml

from runagent.paste.session import Folders, Session, save
from runagent.store.runinfo import Reason, RunStatus
from tests.conftest import Workspace, wait_for

TASK = "Write hello.txt, check it, and finish."


def configure(ws: Workspace, **paste: object) -> Path:
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["chat"] = {"type": "paste"}
    if paste:
        data["paste"] = paste
    ws.config.write_text(yaml.safe_dump(data))
    work = ws.path / "work"
    work.mkdir(exist_ok=True)
    return work


def start(ws: Workspace, *extra: str) -> subprocess.Popen[str]:
    return ws.start_cli("-p", "p", "-t", "t", "-a", "chat", "--cwd", "work", *extra, TASK)


def outbox(ws: Workspace, sequence: int, timeout: float = 60) -> Path:
    folder = Folders.of(ws.task()).outbox
    return wait_for(
        lambda: next(iter(folder.glob(f"*_seq{sequence:04d}.txt")), None),
        timeout=timeout,
        what=f"outbox {sequence}",
    )


def drop(ws: Workspace, name: str, text: str) -> None:
    """Save a reply as a person would: written elsewhere, then moved into the inbox."""
    inbox = Folders.of(ws.task()).inbox
    staged = ws.path / name
    staged.write_text(text)
    os.replace(staged, inbox / name)


def session(ws: Workspace) -> dict[str, object]:
    (path,) = Folders.of(ws.task()).sessions.glob("*.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_a_person_carries_a_task_through_to_done(ws: Workspace) -> None:
    work = configure(ws)
    proc = start(ws)
    first = outbox(ws, 1)
    text = first.read_text()
    assert text.startswith(f"=== HEADER ===\nSession: {first.name[:8]}\nSequence: 1\nTask: {TASK}")
    assert "(empty workspace)" in text and text.endswith(f"=== PROMPT ===\n{TASK}\n")
    drop(
        ws, "reply1.txt",
        "Let me create it.\r\n"
        # A tag not at the start of its line is text.
        "\u201cquotes\u201d are fine: [CREATE_FILE path=\u201chello.txt\u201d]\r\n"
        # An empty last line ends the file with a line break (none is added: CodingAgent's way).
        "[CREATE_FILE path=\u201chello.txt\u201d]\r\nhello\r\n  world\r\n\r\n[/CREATE_FILE]\r\n"
        "[RUN_COMMAND]\r\nwc -l hello.txt\r\n[/RUN_COMMAND]\r\n"
        '[READ_FILE path="hello.txt"]\r\n'
        "[MESSAGE]\r\nCreated the file.\r\n[/MESSAGE]\r\n",
    )  # fmt: skip
    second = outbox(ws, 2).read_text()
    assert (work / "hello.txt").read_text() == "hello\n  world\n"
    assert "  hello.txt (14 bytes)" in second
    assert (
        "## Previous Command Results\n"
        "[OK] CREATE_FILE: Created 'hello.txt'\n"
        "[OK] RUN_COMMAND: Ran 'wc -l hello.txt' (exit code 0)\n"
        "  Output: 2 hello.txt\n"
        "[OK] READ_FILE: Read 'hello.txt' (14 bytes), shown under Requested File Contents\n"
        "[OK] MESSAGE: Shown to the user\n"
    ) in second
    assert "--- hello.txt ---\nhello\n  world\n--- end hello.txt ---" in second
    assert second.endswith("send [DONE] with a summary.\n")
    # Handed in from a terminal: run-agent paste reply FILE.
    reply = ws.path / "done.txt"
    reply.write_text("All set.\n[DONE]\nhello.txt holds two lines.\n[/DONE]\n")
    sent = ws.cli("paste", "reply", str(reply))
    assert sent.returncode == 0, sent.stderr
    code, _, err = finish(proc)
    assert code == 0, err
    assert "MESSAGE: Created the file." in err
    assert "[OK] CREATE_FILE: Created 'hello.txt'" in err
    assert "DONE: hello.txt holds two lines." in err
    (run,) = ws.runs()
    assert run.status is RunStatus.COMPLETED
    assert ws.task().run(run.run_id).output.read_text() == "hello.txt holds two lines.\n"
    state = session(ws)
    assert state["isComplete"] is True and state["sequenceNumber"] == 2
    assert state["messages"] == ["Created the file."]
    # The inbox is empty: every reply was moved aside, each once.
    assert list(Folders.of(ws.task()).inbox.iterdir()) == []
    assert len(list(Folders.of(ws.task()).processed.iterdir())) == 2


def test_the_same_reply_twice_is_applied_once(ws: Workspace) -> None:
    work = configure(ws)
    proc = start(ws)
    outbox(ws, 1)
    reply = "[RUN_COMMAND]\necho x >> log.txt\n[/RUN_COMMAND]\n"
    drop(ws, "a.txt", reply)
    outbox(ws, 2)
    drop(ws, "b.txt", "\n" + reply.replace("\n", "\r\n") + "\n\n")  # the same, pasted again
    processed = Folders.of(ws.task()).processed
    wait_for(lambda: list(processed.glob("*_duplicate_b.txt")), what="the duplicate moved aside")
    assert (work / "log.txt").read_text() == "x\n"
    assert not list(Folders.of(ws.task()).outbox.glob("*_seq0003.txt"))
    drop(ws, "c.txt", "[DONE]\nok\n[/DONE]")
    code, _, err = finish(proc)
    assert code == 0, err
    assert "b.txt is the same reply as the last one (the answer to outbox 1)" in err


def test_paste_reply_of_a_reply_already_applied_says_it_is_a_duplicate(ws: Workspace) -> None:
    work = configure(ws)
    proc = start(ws)
    outbox(ws, 1)
    reply = ws.path / "reply.txt"
    reply.write_text("[RUN_COMMAND]\necho x >> log.txt\n[/RUN_COMMAND]\n")
    sent = ws.cli("paste", "reply", str(reply))
    assert sent.returncode == 0 and "saved as" in sent.stdout, sent.stderr
    outbox(ws, 2, timeout=30)  # a loaded machine: the settle second, then the command
    again = ws.cli("paste", "reply", str(reply))  # the same answer, handed in twice
    assert again.returncode == 2, (again.stdout, again.stderr)
    assert again.stdout == ""
    assert again.stderr.splitlines() == [
        "run-agent: the reply is a duplicate of the last one (the answer to outbox 1), which was "
        "already applied: it was not saved nor applied again; paste the chat's answer to outbox 2"
    ]
    assert list(Folders.of(ws.task()).inbox.iterdir()) == []
    sent = ws.cli("paste", "reply", "-", input="[DONE]\nok\n[/DONE]\n")
    assert sent.returncode == 0, sent.stderr
    assert finish(proc)[0] == 0
    assert (work / "log.txt").read_text() == "x\n"


def test_paste_reply_of_a_reply_waiting_in_the_inbox_says_it_is_a_duplicate(
    ws: Workspace,
) -> None:
    configure(ws)
    folders = Folders.of(ws.task())
    folders.make()
    save(folders, Session.new(TASK))  # no run reads the inbox: the first copy stays there
    text = "[MESSAGE]\nhi\n[/MESSAGE]\n"
    first = ws.cli("paste", "reply", "-", input=text)
    assert first.returncode == 0, first.stderr
    (waiting,) = folders.inbox.iterdir()
    again = ws.cli("paste", "reply", "-", input="\n" + text.replace("\n", "\r\n"))
    assert again.returncode == 2 and again.stderr.splitlines() == [
        f"run-agent: the reply is a duplicate of {waiting.name}, which waits in the inbox: it was "
        "not saved, so the reply is applied once"
    ]
    other = ws.cli("paste", "reply", "-", input="[MESSAGE]\nbye\n[/MESSAGE]\n")
    assert other.returncode == 0, other.stderr
    assert len(list(folders.inbox.iterdir())) == 2


def test_a_reply_asked_for_again_later_is_applied_again(ws: Workspace) -> None:
    work = configure(ws)
    proc = start(ws)
    outbox(ws, 1)
    again = "[RUN_COMMAND]\necho x >> log.txt\n[/RUN_COMMAND]\n"
    drop(ws, "a.txt", again)
    outbox(ws, 2)
    drop(ws, "b.txt", "[MESSAGE]\nbetween\n[/MESSAGE]\n")
    outbox(ws, 3)
    drop(ws, "c.txt", again)  # the same text, but not a repeat of the last reply: the model's
    outbox(ws, 4)
    assert (work / "log.txt").read_text() == "x\nx\n"
    drop(ws, "d.txt", "[DONE]\nok\n[/DONE]")
    assert finish(proc)[0] == 0


def test_a_run_killed_in_the_middle_of_a_reply_does_not_apply_it_twice(ws: Workspace) -> None:
    work = configure(ws)
    (work / "f.txt").write_text("hi\n")
    proc = start(ws)
    outbox(ws, 1)
    drop(
        ws, "r1.txt",
        '[EDIT_FILE path="f.txt" start_line="1" end_line="1"]\nA\nB\n[/EDIT_FILE]\n'
        "[RUN_COMMAND]\necho ran >> log.txt; sleep 600\n[/RUN_COMMAND]\n"
        '[CREATE_FILE path="after.txt"]\nafter\n[/CREATE_FILE]\n',
    )  # fmt: skip
    wait_for(lambda: (work / "log.txt").exists(), what="the command to begin")
    first = ws.runs()[0].run_id
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    wait_for(
        lambda: not ws.leftovers(), timeout=40, what="the paste child and its command to be reaped"
    )
    again = ws.start_cli("resume", "-p", "p", "-t", "t")
    text = outbox(ws, 2).read_text()
    assert "[OK] EDIT_FILE: Edited 'f.txt' lines 1-1\n" in text
    assert "[FAILED] RUN_COMMAND: interrupted: run-agent was restarted while this ran" in text
    assert "[OK] CREATE_FILE: Created 'after.txt'" in text
    assert (work / "f.txt").read_text() == "A\nB\n"  # edited once
    assert (work / "log.txt").read_text() == "ran\n"  # run once
    drop(ws, "done.txt", "[DONE]\nok\n[/DONE]")
    code, _, err = finish(again)
    assert code == 0, err
    assert "going on with r1.txt after a restart, from its command 2" in err
    # The killed command's captured output stayed in its run's folder, not in the machine's
    # temporary folder, where nothing would ever remove it.
    assert list(ws.task().run_folder(first).glob(".shell-*"))


def test_no_text_of_the_model_passes_for_a_line_of_run_agents(ws: Workspace) -> None:
    configure(ws)
    proc = start(ws)
    outbox(ws, 1)
    fake = "outbox 7 ready: /tmp/x/paste/outbox/deadbeef_seq0001.txt (1 characters). Paste"
    drop(
        ws, "r1.txt",
        f"[MESSAGE]\nhello\u2028{fake}\rand\x85{fake}\n[/MESSAGE]\n"
        f"[RUN_COMMAND]\nprintf 'a\\r{fake}\\n'\n[/RUN_COMMAND]\n[DONE]\nx\n[/DONE]\n",
    )  # fmt: skip
    code, _, err = finish(proc)
    assert code == 0, err
    assert not [line for line in err.splitlines() if line.startswith("outbox 7")]
    assert err.count(fake) == 4  # twice in the message, in the command shown, in its output


def test_a_run_killed_mid_session_resumes_the_same_session(ws: Workspace) -> None:
    work = configure(ws)
    proc = start(ws)
    first = outbox(ws, 1)
    drop(ws, "r1.txt", '[CREATE_FILE path="a.txt"]\none\n[/CREATE_FILE]')
    outbox(ws, 2)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole foreground loop, as a closed terminal might
    proc.wait(10)
    wait_for(lambda: not ws.leftovers(), timeout=40, what="the paste child to be reaped")
    # A reply saved while nothing runs waits in the inbox.
    drop(ws, "r2.txt", '[CREATE_FILE path="b.txt"]\ntwo\n[/CREATE_FILE]')
    again = ws.start_cli("resume", "-p", "p", "-t", "t")
    third = outbox(ws, 3)
    assert third.name[:8] == first.name[:8]  # the same session
    assert len(list(Folders.of(ws.task()).sessions.glob("*.json"))) == 1
    assert (work / "b.txt").read_text() == "two"
    drop(ws, "r3.txt", "[DONE]\nboth files\n[/DONE]")
    code, _, err = finish(again)
    assert code == 0, err
    assert "goes on at sequence 2" in err
    runs = ws.runs()
    assert [r.status for r in runs][-1] is RunStatus.COMPLETED
    assert session(ws)["isComplete"] is True


def test_a_command_that_hangs_is_killed_at_30s_with_its_children(ws: Workspace) -> None:
    configure(ws)
    proc = start(ws)
    outbox(ws, 1)
    drop(
        ws, "hang.txt",
        "[RUN_COMMAND]\nsleep 4242.5 & setsid sleep 4243.5 & sleep 4244.5; echo never\n"
        "[/RUN_COMMAND]\n",
    )  # fmt: skip

    def sleepers() -> list[psutil.Process]:
        return [
            p for p in psutil.process_iter(["cmdline"])
            if any(a in ("4242.5", "4243.5", "4244.5") for a in p.info["cmdline"] or [])
        ]  # fmt: skip

    wait_for(lambda: len(sleepers()) == 3, what="the command's three sleeps")
    text = outbox(ws, 2, timeout=60).read_text()
    assert (
        "[FAILED] RUN_COMMAND: 'sleep 4242.5 & setsid sleep 4243.5 & sleep 4244.5; echo never' "
        "timed out after 30 s and was stopped with its children" in text
    )
    assert wait_for(lambda: not sleepers(), timeout=60, what="no sleep left") is True
    drop(ws, "done.txt", "[DONE]\nstopped\n[/DONE]")
    assert finish(proc)[0] == 0


def test_paste_wait_ends_a_run_nobody_answers_and_the_loop_gives_up(ws: Workspace) -> None:
    configure(ws, wait="1s")
    proc = start(ws)
    code, _, err = finish(proc)
    assert code == 1, err
    (run,) = ws.runs()
    assert run.status is RunStatus.FAILED
    assert run.reason is Reason.EXIT_CODE and run.exit_code == 2
    assert run.message == "no reply to outbox 1 came within paste.wait 1s (exit code 2)"
    assert "which a retry cannot fix; not restarting" in err


def test_waiting_for_a_person_is_not_an_idle_agent(ws: Workspace) -> None:
    configure(ws)
    # The idle clock runs from before the agent's start: 5 s, not 1, lets a loaded machine
    # start it; then two idle timeouts pass while the person reads.
    proc = start(ws, "--idle-timeout", "5s")
    outbox(ws, 1)
    stderr = ws.task().run(ws.runs()[0].run_id).stderr
    wait_for(lambda: "still waiting for the reply to outbox 1" in stderr.read_text(),
             what="the agent to say it still waits")  # fmt: skip
    time.sleep(11)
    assert proc.poll() is None and len(ws.runs()) == 1
    drop(ws, "done.txt", "[DONE]\nread it\n[/DONE]")
    assert finish(proc)[0] == 0


def test_paste_reply_refuses_in_one_line_what_it_cannot_hand_in(ws: Workspace) -> None:
    configure(ws)
    reply = ws.path / "reply.txt"
    reply.write_text("[DONE]\nx\n[/DONE]\n")

    def refused(*args: str, input: str | None = None) -> str:
        done = ws.invoke("paste", *args, input=input)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        (line,) = done.stderr.splitlines()
        return line

    assert "no paste run waits for a reply under" in refused("reply", str(reply))
    assert "cannot be read (No such file or directory)" in refused("reply", "nope.txt")
    assert refused("reply", str(reply), "-p", "p") == (
        "run-agent: give both --project and --task, or neither for the waiting paste run"
    )
    assert "project 'p' not found under" in refused("reply", str(reply), "-p", "p", "-t", "x")
    for task in ("a", "b"):  # two sessions waiting: which one is meant must be said
        folders = Folders.of(ws.task("p", task))
        folders.make()
        save(folders, Session.new("x"))
    assert "several paste runs wait for a reply (p/a, p/b)" in refused("reply", str(reply))
    assert refused("reply", "-", "-p", "p", "-t", "a", input="  \n") == (
        "run-agent: the reply is empty; paste the chat's whole answer"
    )
    sent = ws.invoke("paste", "reply", "-", "-p", "p", "-t", "a", input="[DONE]\nok\n[/DONE]")
    assert sent.returncode == 0 and "saved as" in sent.stdout
    shown = ws.invoke("paste", "show", "-p", "p", "-t", "b", "--path")
    assert shown.returncode == 0 and shown.stdout.strip().endswith("_seq0001.txt")


def test_a_command_that_needs_approval_waits_for_the_person_at_the_terminal(
    ws: Workspace,
) -> None:
    work = configure(ws)
    (work / "build").mkdir()
    proc = start(ws)
    outbox(ws, 1)
    drop(ws, "clean.txt", "[RUN_COMMAND]\nrm -r build && echo cleaned\n[/RUN_COMMAND]\n")
    run_id = wait_for(lambda: ws.runs() and ws.runs()[0].run_id)
    pending = ws.task().run(run_id).folder / "approval-pending.json"
    wait_for(pending.exists, what="the pause for approval")
    operation = json.loads(pending.read_text())["operationId"]
    assert (work / "build").is_dir()  # nothing ran before the person said so
    approved = ws.cli("ops", "approve", run_id, operation)
    assert approved.returncode == 0, approved.stderr
    second = outbox(ws, 2).read_text()
    assert "[OK] RUN_COMMAND: Ran 'rm -r build && echo cleaned' (exit code 0)" in second
    assert not (work / "build").exists()
    drop(ws, "done.txt", "[DONE]\nclean\n[/DONE]")
    code, _, err = finish(proc)
    assert code == 0, err
    assert f"waiting for approval of operation {operation!r} (rm -r build && echo cleaned)" in err
    assert f"run-agent ops approve {run_id} {operation}" in err


def test_a_reply_is_never_handed_in_through_an_inbox_that_links_out(ws: Workspace) -> None:
    configure(ws)
    folders = Folders.of(ws.task())
    folders.make()
    save(folders, Session.new("x"))
    outside = ws.path / "elsewhere"
    outside.mkdir()
    folders.inbox.rmdir()
    folders.inbox.symlink_to(outside)
    done = ws.invoke("paste", "reply", "-", input="[DONE]\nx\n[/DONE]")
    assert done.returncode == 2
    assert "leads out of the runs root (a link); replace it with a folder" in done.stderr
    assert list(outside.iterdir()) == []


def test_a_pause_of_a_killed_run_can_no_longer_be_approved(ws: Workspace) -> None:
    work = configure(ws)
    (work / "build").mkdir()
    proc = start(ws)
    outbox(ws, 1)
    drop(ws, "r1.txt", "[RUN_COMMAND]\nrm -r build; echo ran >> count.txt\n[/RUN_COMMAND]\n")
    first = wait_for(lambda: ws.runs() and ws.runs()[0].run_id)
    pending = ws.task().run(first).folder / "approval-pending.json"
    wait_for(pending.exists, what="the pause for approval")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    wait_for(lambda: not ws.leftovers(), timeout=40, what="the paste child to be reaped")
    again = ws.start_cli("resume", "-p", "p", "-t", "t")
    text = outbox(ws, 2).read_text()
    assert "[FAILED] RUN_COMMAND: interrupted" in text
    assert not pending.exists()  # the dead run's pause was withdrawn
    late = ws.cli("ops", "approve", first, "seq1-1")
    assert late.returncode == 2 and "awaits no approval" in late.stderr
    assert not (work / "count.txt").exists() and (work / "build").is_dir()
    drop(ws, "done.txt", "[DONE]\nok\n[/DONE]")
    assert finish(again)[0] == 0


def test_a_reply_cut_short_and_then_replaced_is_reported_with_what_it_did(ws: Workspace) -> None:
    work = configure(ws)
    proc = start(ws)
    outbox(ws, 1)
    drop(
        ws, "r1.txt",
        '[CREATE_FILE path="k1.txt"]\nx\n[/CREATE_FILE]\n'
        "[RUN_COMMAND]\nsleep 600\n[/RUN_COMMAND]\n"
        '[CREATE_FILE path="k3.txt"]\nx\n[/CREATE_FILE]\n',
    )  # fmt: skip
    wait_for(lambda: (work / "k1.txt").exists(), what="the first command")
    wait_for(lambda: running(proc.pid, ["sleep", "600"]), what="the second command to run")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    wait_for(lambda: not ws.leftovers(), timeout=40, what="the paste child to be reaped")
    (Folders.of(ws.task()).inbox / "r1.txt").unlink()
    drop(ws, "r2.txt", "[MESSAGE]\nnew reply\n[/MESSAGE]\n")
    again = ws.start_cli("resume", "-p", "p", "-t", "t")
    text = outbox(ws, 2).read_text()
    assert (
        "[OK] CREATE_FILE: Created 'k1.txt'\n"
        "[FAILED] REPLY: run-agent was restarted while it carried out your previous reply"
    ) in text
    assert "[OK] MESSAGE: Shown to the user" in text
    assert not (work / "k3.txt").exists()
    drop(ws, "done.txt", "[DONE]\nok\n[/DONE]")
    assert finish(again)[0] == 0


def running(pid: int, argv: list[str]) -> bool:
    """Whether a process below `pid` runs exactly `argv`."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return False
    for child in below:
        try:
            if child.cmdline() == argv:
                return True
        except psutil.Error:
            continue
    return False


def test_a_person_is_told_once_each_time_the_run_waits_on_them(ws: Workspace) -> None:
    configure(ws)
    told = ws.path / "told.jsonl"
    data = yaml.safe_load(ws.config.read_text())
    write = (
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT);"
        " os.write(fd, sys.stdin.buffer.read() + b'\\n')"
    )  # one write each: threads send
    data["notify"] = {"command": ["python3", "-c", write, str(told)], "on": ["needs_input"]}
    ws.config.write_text(yaml.safe_dump(data))
    (ws.path / "work" / "build").mkdir()

    def needs() -> list[dict[str, object]]:
        lines = told.read_text().splitlines() if told.exists() else []
        return [json.loads(line) for line in lines if line.strip()]

    proc = start(ws)
    first = outbox(ws, 1)
    wait_for(lambda: len(needs()) == 1, what="the first needs_input")
    (reply,) = needs()
    assert reply["event"] == "needs_input" and reply["waits_for"] == "reply"
    assert reply["link"] == "http://127.0.0.1:14355/#p/t"
    assert (
        f"run-agent paste reply FILE -p p -t t (FILE: the chat's answer to {first})"
        == reply["answer"]
    )
    drop(ws, "clean.txt", "[RUN_COMMAND]\nrm -r build && echo cleaned\n[/RUN_COMMAND]\n")
    run_id = wait_for(lambda: ws.runs() and ws.runs()[0].run_id)
    pending = ws.task().run(run_id).folder / "approval-pending.json"
    wait_for(pending.exists, what="the pause for approval")
    operation = json.loads(pending.read_text())["operationId"]
    wait_for(lambda: len(needs()) == 2, what="the approval's needs_input")
    approval = needs()[1]
    assert approval["waits_for"] == "approval"
    assert str(approval["answer"]).startswith(f"run-agent ops approve {run_id} {operation}")
    assert ws.cli("ops", "approve", run_id, operation).returncode == 0
    outbox(ws, 2)
    wait_for(lambda: len(needs()) == 3, what="the second reply's needs_input")
    assert needs()[2]["waits_for"] == "reply"
    drop(ws, "done.txt", "[DONE]\nclean\n[/DONE]")
    code, _, err = finish(proc)
    assert code == 0, err
    assert len(needs()) == 3  # once per wait, however many ticks it lasted
