"""The copy-paste protocol's text: the instructions every outbox repeats, the section markers, the
commands, and how one outbox is put together from a session's state."""

from __future__ import annotations

import enum
from collections.abc import Sequence

from runagent.record import record

VERSION = "1.0"

HEADER = "=== HEADER ==="
PROTOCOL = "=== PROTOCOL ==="
CONTEXT = "=== CONTEXT ==="
PROMPT = "=== PROMPT ==="

CONTINUATION = (
    "Continue working on the task based on the results above. If the task is complete, send "
    "[DONE] with a summary."
)
EMPTY_WORKSPACE = "(empty workspace)"
REJECTED = "REJECTED: Path is outside workspace"

COMMAND_TIMEOUT = 30.0  # seconds a RUN_COMMAND may take before its whole tree is killed
OUTPUT_LIMIT = 4000  # characters of a command's output fed back to the model
RESULTS_LIMIT = 100_000  # characters of Previous Command Results in one outbox
TITLE_LIMIT = 200  # characters of the task on the header's Task line (the prompt has it all)


class Name(enum.StrEnum):
    CREATE_FILE = "CREATE_FILE"
    EDIT_FILE = "EDIT_FILE"
    DELETE_FILE = "DELETE_FILE"
    READ_FILE = "READ_FILE"
    RUN_COMMAND = "RUN_COMMAND"
    MESSAGE = "MESSAGE"
    DONE = "DONE"


SELF_CLOSING = frozenset({Name.DELETE_FILE, Name.READ_FILE})
REQUIRED: dict[Name, tuple[str, ...]] = {
    Name.CREATE_FILE: ("path",),
    Name.EDIT_FILE: ("path", "start_line", "end_line"),
    Name.DELETE_FILE: ("path",),
    Name.READ_FILE: ("path",),
}

INSTRUCTIONS = f"""\
You are a coding agent working in a workspace folder on the user's machine, through copy and
paste (protocol version {VERSION}). You cannot run anything yourself: you act by writing command
blocks in your reply. The user saves your whole reply to a file, and the agent on their machine
carries out every command block in it, in order, then sends you the results in a message like
this one. Text outside command blocks is ignored, so you may explain your thinking freely.

Commands (each opening tag starts its own line; each closing tag is alone on its own line):

[CREATE_FILE path="relative/path"]
the whole content of the file
[/CREATE_FILE]
  Creates the file, or replaces it, with the lines between the tags, exactly as written
  (indentation kept), joined by line breaks: for a line break at the end of the file, leave
  an empty line before [/CREATE_FILE]. Parent folders are created.

[EDIT_FILE path="relative/path" start_line="N" end_line="M"]
replacement lines
[/EDIT_FILE]
  Replaces lines N to M (1-based, both included) of an existing file with the lines between the
  tags, which may be more or fewer lines. Commands are carried out in order, so line numbers
  refer to the file as the commands before this one left it: when you edit one file several
  times in one reply, number each edit in the file as the earlier edits changed it (or edit
  from the last lines up, so that the numbers above stay the same). An end_line past the last
  line of the file means "to the end of the file".

[DELETE_FILE path="relative/path"]
  Deletes a file. No closing tag, and nothing else on the tag's line.

[READ_FILE path="relative/path"]
  Asks for a file's content; it is shown to you in the next message, under "Requested File
  Contents". No closing tag, and nothing else on the tag's line.

[RUN_COMMAND]
command line
[/RUN_COMMAND]
  Runs the command with /bin/sh -c in the workspace folder. It is stopped after
  {COMMAND_TIMEOUT:g} seconds. You see its exit code and the first {OUTPUT_LIMIT} characters of
  its output in the next message. Some commands need the user's approval first, or are not
  allowed at all; the result says so.

[MESSAGE]
text for the user
[/MESSAGE]
  Shows the text to the user.

[DONE]
a summary of what you did
[/DONE]
  Ends the task. Send it only when the task is complete; commands after it are not carried out.

Rules:
- Paths are relative to the workspace folder and use forward slashes. A path that leads outside
  the workspace is rejected.
- Write command blocks as plain text. Do not put them inside markdown code fences, and do not
  wrap the content of a file in a code fence: everything between the tags is the content.
- Write attribute values in straight double quotes: path="src/main.py". Write each attribute
  of a tag once.
- Read a file before you edit it by line numbers, so that the numbers are right.
- Work in steps: act, read the results in the next message, act again. Fix what failed.
- When the task is complete, send [DONE] with a summary."""


@record
class Result:
    """The outcome of one command (or of a block that could not be read), as the next outbox
    reports it: `[OK] NAME: summary` or `[FAILED] NAME: summary`, then its output, if any."""

    command: str
    success: bool
    summary: str
    output: str | None = None

    def to_dict(self) -> dict[str, object]:
        found: dict[str, object] = {
            "command": self.command,
            "success": self.success,
            "summary": self.summary,
        }
        if self.output is not None:
            found["output"] = self.output
        return found

    @classmethod
    def from_dict(cls, data: object) -> Result:
        if not isinstance(data, dict):
            raise ValueError(f"a result is an object, not {type(data).__name__}")
        output = data.get("output")
        return cls(
            str(data["command"]),
            bool(data["success"]),
            str(data["summary"]),
            None if output is None else str(output),
        )

    def lines(self) -> list[str]:
        found = [f"[{'OK' if self.success else 'FAILED'}] {self.command}: {self.summary}"]
        if self.output is not None:
            shown = self.output.rstrip("\n").split("\n")
            if len(shown) == 1:
                found.append(f"  Output: {shown[0]}")
            else:
                found.append("  Output:")
                found.extend(f"    {line}" if line else "" for line in shown)
        return found


@record
class FileEntry:
    path: str
    size: int


@record
class Listing:
    """The workspace's files, and how many more there were than the outbox shows."""

    files: tuple[FileEntry, ...]
    left_out: int = 0
    note: str | None = None


@record
class Requested:
    """A file asked for with READ_FILE: its text, or why it is not shown."""

    path: str
    text: str


def render(
    *,
    session_id: str,
    sequence: int,
    task: str,
    listing: Listing,
    results: Sequence[Result],
    requested: Sequence[Requested],
) -> str:
    """One outbox, exactly in the spec's four sections."""
    title = " ".join(task.split())
    if len(title) > TITLE_LIMIT:
        title = title[: TITLE_LIMIT - 3] + "..."
    header = [HEADER, f"Session: {session_id}", f"Sequence: {sequence}", f"Task: {title}"]
    context = [CONTEXT, "## Workspace Files"]
    if listing.files:
        context += [f"  {f.path} ({f.size} bytes)" for f in listing.files]
    else:
        context.append(EMPTY_WORKSPACE)
    if listing.left_out:
        context.append(f"  ... and {listing.left_out} more files, not listed")
    if listing.note:
        context.append(f"  ({listing.note})")
    if sequence > 1:
        context += ["", "## Previous Command Results"]
        budget = RESULTS_LIMIT
        for n, result in enumerate(results):
            lines = result.lines()
            budget -= sum(len(line) + 1 for line in lines)
            if budget < 0:
                context.append(f"... and {len(results) - n} more results, not shown (too long)")
                break
            context += lines
        if not results:
            context.append("(no commands were found in your last reply)")
    if requested:
        context += ["", "## Requested File Contents"]
        for item in requested:
            context += [f"--- {item.path} ---", item.text.rstrip("\n"), f"--- end {item.path} ---"]
    prompt = [PROMPT, task.strip("\n") if sequence == 1 else CONTINUATION]
    sections = (header, [PROTOCOL, INSTRUCTIONS], context, prompt)
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def outbox_name(session_id: str, sequence: int) -> str:
    return f"{session_id}_seq{sequence:04d}.txt"
