"""Notifications when runs complete, fail or give up: a command to run and/or a webhook to call.

Each notification is sent from a background thread, retried with backoff, and never blocks the
loop; a supervisor waits a bounded time for pending ones before it exits. A webhook gets a JSON
body, signed with HMAC-SHA256 in X-Run-Agent-Signature when a secret is configured.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runagent.config.settings import Config, NotifyConfig, NotifyEvent
from runagent.loop import needs
from runagent.loop.events import Event, EventKind, Outcome
from runagent.loop.redaction import Redactor
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunStatus

SIGNATURE_HEADER = "X-Run-Agent-Signature"
ATTEMPTS = 4
BACKOFF = 1.0
TIMEOUT = 15.0
DRAIN = 30.0  # seconds a process that ends waits for its notifications to go out


def signature(secret: str, body: bytes) -> str:
    import hashlib  # with hmac, only paid for when a webhook is signed
    import hmac

    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Notifier:
    """Sends notifications for one loop; `send` returns at once, `drain` waits for the rest."""

    def __init__(
        self,
        config: NotifyConfig,
        env: Mapping[str, str],
        *,
        log: Callable[[str], None] = lambda line: None,
        sleep: Callable[[float], None] = time.sleep,
        redactor: Redactor | None = None,
        page: str | None = None,  # the page's address, for a link that answers
    ) -> None:
        self.config = config
        self.redactor = redactor or Redactor()
        self.env = env
        self.log = log
        self.sleep = sleep
        self.page = page
        self._threads: list[threading.Thread] = []
        self._asked: set[tuple[str, str, str]] = set()  # needs_input episodes told already

    def send(self, event: NotifyEvent, payload: Mapping[str, Any]) -> None:
        if event not in self.config.events:
            return
        body = {"event": event.value, "time": datetime.now(UTC).isoformat(), **payload}
        body = self.redactor.data(body)  # it may quote the agent's output
        thread = threading.Thread(target=self._deliver, args=(body,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _deliver(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        if self.config.command:
            self._retry("command", lambda: self._run_command(data, body))
        if self.config.webhook:
            self._retry("webhook", lambda: self._post(data))

    def _retry(self, what: str, action: Callable[[], None]) -> None:
        delay = BACKOFF
        for attempt in range(1, ATTEMPTS + 1):
            try:
                action()
                return
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                if attempt == ATTEMPTS:
                    self.log(f"notification {what} failed {ATTEMPTS} times, giving up: {exc}")
                    return
                self.log(f"notification {what} failed ({exc}); retrying in {delay:g}s")
                self.sleep(delay)
                delay *= 2

    def _run_command(self, data: bytes, body: Mapping[str, Any]) -> None:
        env = {**self.env, **{f"RUN_AGENT_{k.upper()}": str(v) for k, v in body.items()
                              if isinstance(v, str | int | float)}}  # fmt: skip
        done = subprocess.run(
            list(self.config.command), input=data, env=env, capture_output=True, timeout=TIMEOUT
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.config.command[0]} exited {done.returncode}")

    def on_event(self, event: Event, task: TaskPaths, schedule: str | None) -> None:
        """Which of a loop's events notify: a failed or timed-out run, and the loop's end
        (completed, or gave up; a stop asked for by a person tells nobody)."""
        base = {"project_id": task.project_id, "task_id": task.task_id, "schedule": schedule}
        if event.kind is EventKind.TICK and event.run_folder is not None:
            self._needs_input(task, base, event.run_folder)
        elif event.kind is EventKind.RUN_ENDED and event.run is not None:
            if event.run.status in (RunStatus.FAILED, RunStatus.TIMED_OUT):
                self.send(NotifyEvent.FAILED, {**base, "run": event.run.to_dict()})
        elif event.kind is EventKind.LOOP_ENDED and event.outcome is not None:
            if event.outcome is Outcome.COMPLETED:
                self.send(NotifyEvent.COMPLETED, {**base, "message": event.message})
            elif event.outcome is not Outcome.STOPPED:
                outcome = {"outcome": event.outcome.value, "message": event.message}
                self.send(NotifyEvent.GAVE_UP, {**base, **outcome})
            if event.outcome in (Outcome.STUCK, Outcome.BUDGET):
                self._ask(base, needs.stopped(task, event.outcome.value, event.message))

    def _needs_input(self, task: TaskPaths, base: Mapping[str, Any], run_folder: Path) -> None:
        """Tell once per episode that the run waits on a person: an operation held for approval
        (ops, `approvals: wait`), or a copy-paste run waiting for the chat's reply."""
        if NotifyEvent.NEEDS_INPUT not in self.config.events:
            return
        for need in (needs.approval(task, run_folder), needs.reply(task)):
            if need is not None:
                self._ask(base, need)

    def wants(self, event: NotifyEvent) -> bool:
        """Whether this notifier sends `event` (`notify.events`)."""
        return event in self.config.events

    def tell_need(self, need: needs.Need, schedule: str | None = None) -> None:
        """Tell, once, what a task waits for from a person that its own loop does not see (a
        task blocked by one it runs after: told by whoever finds it first)."""
        project, _, task = need.label.partition("/")
        self._ask({"project_id": project, "task_id": task, "schedule": schedule}, need)

    def _ask(self, base: Mapping[str, Any], need: needs.Need) -> None:
        if (need.label, need.waits_for, need.episode) in self._asked:
            return
        self._asked.add((need.label, need.waits_for, need.episode))
        link = f"{self.page}/#{need.label}" if self.page else None
        self.send(NotifyEvent.NEEDS_INPUT, {**base, "waits_for": need.waits_for,
                                            "message": need.message, "answer": need.answer,
                                            "link": link})  # fmt: skip

    def _post(self, data: bytes) -> None:
        # urllib.request brings http, ssl and email (~20 ms): a run that sends no webhook
        # (most) does not pay for them.
        import urllib.error
        import urllib.request

        assert self.config.webhook is not None
        headers = {"Content-Type": "application/json", "User-Agent": "run-agent"}
        secret = self.env.get(self.config.secret_env or "") if self.config.secret_env else None
        if self.config.secret_env and not secret:
            raise RuntimeError(f"{self.config.secret_env} is not set; the webhook is not signed")
        if secret:
            headers[SIGNATURE_HEADER] = signature(secret, data)
        request = urllib.request.Request(self.config.webhook, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"HTTP {exc.code} from the webhook") from exc


def loop_notifier(
    config: Config, schedule: str | None, log: Callable[[str], None], redactor: Redactor
) -> Notifier | None:
    """The notifier of a task's loop: its schedule's settings, else the global ones, else none."""
    settings = config.notify
    if schedule and schedule in config.schedules:
        settings = config.schedules[schedule].notify or settings
    if settings is None:
        return None
    server = config.server
    page = f"http://{server.host}:{server.port}"
    return Notifier(settings, dict(os.environ), log=log, redactor=redactor, page=page)
