"""What a foreground loop shows: a line per event, and in a terminal a live status line."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from runagent.loop.events import Event, EventKind, Outcome
from runagent.store import runfolder
from runagent.store.runinfo import RunInfo

# An agent's own colours and cursor moves (CSI and OSC sequences), which would garble the line.
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


ECHO_CHUNK = 1 << 20  # bytes of an agent's stdout echoed per look
OSC52_LIMIT = 1 << 20  # bytes of text a terminal is asked to copy (terminals cap it themselves)


def osc52(text: str) -> str:
    """The escape sequence that asks a terminal to put `text` on its clipboard."""
    import base64  # only a copy to the terminal's clipboard pays for it

    data = base64.b64encode(text.encode("utf-8")[:OSC52_LIMIT]).decode("ascii")
    return f"\x1b]52;c;{data}\x07"


class Console:
    """What a foreground run shows: a line per event, and in a terminal a live status line."""

    def __init__(
        self,
        stream: TextIO,
        max_attempts: int,
        quiet: bool,
        summarize: Callable[[str], str | None] = lambda line: line,
        echo: bool = False,
        terminal_copy: Callable[[str, Path], str | None] = lambda line, run_folder: None,
    ) -> None:
        """`echo`: print each whole line the agent writes to stdout (a backend that talks to a
        person there); `terminal_copy`: for such a line, text to put on the clipboard of the
        terminal (OSC 52, which reaches a person's own machine over SSH too), or None."""
        self.stream = stream
        self.summarize = summarize
        self.echo = echo
        self.terminal_copy = terminal_copy
        self._echoed: tuple[Path | None, int] = (None, 0)  # the run folder, and bytes shown
        self.max_attempts = max_attempts
        self.quiet = quiet
        self.live = stream.isatty() and not quiet
        self._status_shown = False
        self._last_attempt: int | None = None  # the highest attempt number this loop may reach

    def say(self, text: str) -> None:
        if self.quiet:
            return
        self._clear()
        print(f"run-agent: {text}", file=self.stream, flush=True)

    def relay(self, line: str, always: bool = False) -> None:
        """A line a loop elsewhere wrote (its supervisor.log), as it wrote it."""
        if self.quiet and not always:
            return
        self._clear()
        print(line, file=self.stream, flush=True)

    def done(self) -> None:
        """Nothing more comes: the status line goes."""
        self._clear()

    def _clear(self) -> None:
        if self._status_shown:
            self.stream.write("\r\x1b[K")
            self._status_shown = False

    def show(self, event: Event) -> None:
        info = event.run
        ends = event.kind in (EventKind.TICK, EventKind.RUN_ENDED)
        if self.echo and not self.quiet and event.run_folder is not None and ends:
            self._echo(event.run_folder)
        if event.kind is EventKind.RUN_STARTED and info is not None:
            if info.last_attempt is not None:  # as the loop counts it (a steered run is free)
                self._last_attempt = info.last_attempt
            elif self._last_attempt is None:  # numbers go on across loops: N of at most M
                self._last_attempt = info.attempt - 1 + self.max_attempts
            self.say(
                f"attempt {info.attempt}/{self._last_attempt}: run {info.run_id} started "
                f"({info.agent}) in {event.run_folder}"
            )
        elif event.kind is EventKind.RUN_ENDED and info is not None:
            self.say(
                f"attempt {info.attempt}: run {info.run_id} {info.status.value}: {info.message}"
            )
        elif event.kind is EventKind.CHECKING and info is not None:
            self.say(f"attempt {info.attempt}: run {info.run_id} says it is done; checking with "
                     f"`{event.message}`")  # fmt: skip
        elif event.kind is EventKind.WAITING:
            note = f"{event.message}; " if event.message else ""
            self.say(f"{note}restarting in {event.delay:g}s")
        elif event.kind in (EventKind.MARKED_LOST, EventKind.DONE_ARCHIVED, EventKind.BRANCH_KEPT):
            self.say(event.message or f"run {info.run_id if info else '?'} marked lost")
        elif event.kind is EventKind.TICK and self.live and info is not None:
            self._status(info, event)

    def _echo(self, folder: Path) -> None:
        """Print the whole lines the run's stdout gained since the last look."""
        shown = self._echoed[1] if self._echoed[0] == folder else 0
        try:
            with open(runfolder.RunPaths(folder).stdout, "rb") as f:
                f.seek(shown)
                data = f.read(ECHO_CHUNK)
        except OSError:
            return
        whole = data[: data.rfind(b"\n") + 1]
        self._echoed = (folder, shown + len(whole))
        for raw in whole.decode("utf-8", errors="replace").splitlines():
            line = "".join(c for c in ANSI.sub("", raw) if c.isprintable() or c == "\t")
            self._clear()
            print(line, file=self.stream, flush=True)
            copied = self.terminal_copy(line, folder)
            if copied is not None and self.stream.isatty():
                self.stream.write(osc52(copied))
                self.stream.flush()

    def _status(self, info: RunInfo, event: Event) -> None:
        import shutil  # only a live status line on a terminal

        width = shutil.get_terminal_size((100, 20)).columns
        minutes, seconds = divmod(int(event.elapsed), 60)
        of = self._last_attempt or self.max_attempts
        head = f"attempt {info.attempt}/{of} · running · {minutes:02d}:{seconds:02d}"
        last = ""
        if event.run_folder is not None:
            lines = runfolder.tail(runfolder.RunPaths(event.run_folder).stdout, 8192).splitlines()
            for line in reversed(lines):
                last = (self.summarize(line) or "").strip() if line.strip() else ""
                if last:
                    break
        line = f"{head} · {last}" if last else head
        shown = "".join(c for c in ANSI.sub("", line) if c.isprintable())[: width - 1]
        self.stream.write("\r\x1b[K" + shown)
        self.stream.flush()
        self._status_shown = True

    def finish(self, message: str, outcome: Outcome) -> None:
        self._clear()
        print(f"run-agent: {message}", file=self.stream, flush=True)
