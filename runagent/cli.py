"""The `run-agent` command line: the only place that prints or exits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

import click

import backends
from runagent import __version__, notify, runfolder, tasks
from runagent import schedule as sched
from runagent.config import AgentConfig, Config, LoopSettings, NotifyEvent, ScheduleConfig, Until
from runagent.configfile import find_config, load_config, parse_duration, runs_root
from runagent.context import new_task_id, validate_id, validate_prompt
from runagent.errors import (
    ExitCode,
    MissingDependencyError,
    NotFoundError,
    RunAgentError,
    UsageError,
)
from runagent.lock import live_holder
from runagent.redaction import Redactor
from runagent.runfolder import RunInfo, RunStatus, TaskPaths
from runagent.supervisor import Event, EventKind, LoopRequest, Outcome, Supervisor

OUTCOME_EXIT = {
    Outcome.COMPLETED: ExitCode.COMPLETED,
    Outcome.FAILED: ExitCode.FAILED,
    Outcome.TIMED_OUT: ExitCode.TIMED_OUT,
    Outcome.STOPPED: ExitCode.STOPPED,
    Outcome.MISSING_DEPENDENCY: ExitCode.MISSING_DEPENDENCY,
}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_WAIT_MARGIN = 15.0
NOTIFY_DRAIN = 30.0  # seconds a finished loop waits for its notifications to go out
MAX_PROMPT_BYTES = 10 << 20  # a prompt is text a person wrote; more is a wrong file (/dev/zero)


class RunAgentGroup(click.Group):
    """`run-agent ARGS` means `run-agent run ARGS` unless ARGS starts with a command name;
    a RunAgentError becomes its one-line message and its exit code."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["run", *args]
        elif not args:
            args = ["--help"]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # click's own: one line too, with where to read more
            if (
                type(exc).__name__ == "NoArgsIsHelpError"
            ):  # click >= 8.2 showing a bare group's help
                raise
            where = exc.ctx.command_path if exc.ctx is not None else "run-agent"
            fail(f"{exc.format_message()} (see `{where} --help`)", ExitCode.USAGE)
        except RunAgentError as exc:
            fail(str(exc), exc.exit_code)
        except OSError as exc:  # a folder or file the system refused: say which, not a traceback
            where = f": {exc.filename}" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", ExitCode.FAILED)
        except KeyboardInterrupt:
            sys.exit(ExitCode.STOPPED)


def fail(message: str, code: ExitCode) -> NoReturn:
    click.echo(f"run-agent: {message}", err=True)
    sys.exit(int(code))


@click.group(cls=RunAgentGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="run-agent")
def cli() -> None:
    """Run an AI coding agent in a supervised run folder, restarting it until the task is done.

    `run-agent --project P --task T "prompt"` is short for `run-agent run ...`.
    """


# Shared options ---------------------------------------------------------------------------


class PathValue(click.Path):
    """A click.Path that refuses an empty value, which would quietly mean the current folder."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is empty; give a path, or leave the option out", param, ctx)
        return super().convert(value, param, ctx)


@dataclass(frozen=True)
class Setup:
    config: Config
    root: Path


def common(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--root",
        type=PathValue(file_okay=False, path_type=Path),
        help="Runs root folder (default: storage.runs_dir of the config, else ./runs).",
    )(f)
    return click.option(
        "--config",
        "config_path",
        type=PathValue(dir_okay=False, path_type=Path),
        help="config.yaml to use (default: ./config.yaml, then ~/.config/run-agent/).",
    )(f)


def setup(config_path: Path | None, root: Path | None) -> Setup:
    cwd = Path.cwd()
    config = load_config(find_config(config_path, cwd, os.environ), backends.known(), cwd)
    return Setup(config, runs_root(root, os.environ, config))


def existing_task(
    config_path: Path | None, root: Path | None, project_id: str, task_id: str
) -> tuple[Setup, TaskPaths]:
    """The setup and an existing task's paths; a bad or unknown id is a one-line error."""
    s = setup(config_path, root)
    project = validate_id("project", project_id)
    return s, tasks.find_task(s.root, project, validate_id("task", task_id))


def task_option(required: bool) -> Callable[..., Any]:
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option(
            "--task", "-t", "task_id", required=required, help="Task id (letters, digits, . _ -)."
        )(f)
        return click.option("--project", "-p", "project_id", required=required, help="Project id.")(
            f
        )

    return decorate


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)


def loop_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--agent", "-a", help="Agent from config.yaml `agents:` (or a backend name)."),
        click.option(
            "--cwd",
            "working_dir",
            type=PathValue(file_okay=False, path_type=Path),
            help="Working folder of the agent (default: the current folder).",
        ),
        click.option(
            "--max-restarts", type=click.IntRange(min=0), help="Restarts after the first run."
        ),
        click.option(
            "--restart-delay", help="First backoff, e.g. 2s; it doubles up to restart_delay_max."
        ),
        click.option("--timeout", help="Stop a run after this long in total, e.g. 30m (0: never)."),
        click.option(
            "--idle-timeout", help="Stop a run after this long without output (0: never)."
        ),
        click.option(
            "--until",
            type=click.Choice([u.value for u in Until]),
            help="exit: exit 0 completes the task; done-file: only a DONE file does.",
        ),
        click.option("--quiet", "-q", is_flag=True, help="Print only the final line."),
        click.option("--schedule", hidden=True, help="The schedule that fired this loop."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


# run, job, resume -------------------------------------------------------------------------


@cli.command()
@task_option(required=False)
@click.argument("prompt", required=False)
@click.option(
    "--prompt-file",
    type=PathValue(exists=True, dir_okay=False, path_type=Path),
    help="Read the prompt from a file ('-' as PROMPT reads standard input).",
)
@loop_options
@common
def run(
    project_id: str | None, task_id: str | None, prompt: str | None, prompt_file: Path | None,
    **options: Any,
) -> None:  # fmt: skip
    """Run a task in a loop: restart the agent until it completes or the loop gives up."""
    start_loop(project_id, task_id, prompt, prompt_file, **options)


@cli.command()
@task_option(required=False)
@click.argument("prompt", required=False)
@click.option("--prompt-file", type=PathValue(exists=True, dir_okay=False, path_type=Path))
@loop_options
@common
def job(
    project_id: str | None, task_id: str | None, prompt: str | None, prompt_file: Path | None,
    **options: Any,
) -> None:  # fmt: skip
    """Run the agent once: one run, no restarts."""
    options["max_restarts"] = 0
    start_loop(project_id, task_id, prompt, prompt_file, **options)


@cli.command()
@task_option(required=True)
@loop_options
@common
def resume(project_id: str, task_id: str, **options: Any) -> None:
    """Run a task's loop again from its TASK.md."""
    s, task = existing_task(options["config_path"], options["root"], project_id, task_id)
    view = tasks.view(task)
    if view.status is tasks.TaskStatus.COMPLETED:
        raise UsageError(
            f"task {view.label} is already completed; remove {task.done} to run it again"
        )
    prompt = runfolder.read_task_prompt(task)
    if prompt is None:
        raise NotFoundError(f"task {view.label} has no TASK.md to resume from ({task.task_md})")
    foreground_loop(
        s, task, validate_prompt(prompt, f"the task's prompt in {task.task_md}"), options
    )


def start_loop(
    project_id: str | None,
    task_id: str | None,
    prompt: str | None,
    prompt_file: Path | None,
    **options: Any,
) -> None:
    s = setup(options["config_path"], options["root"])
    if project_id is None:
        raise UsageError("--project is required: say which project the task belongs to")
    validate_id("project", project_id)
    generated = task_id is None  # an empty --task is refused, not replaced
    task_id = new_task_id() if task_id is None else validate_id("task", task_id)
    task = TaskPaths(s.root, project_id, task_id)
    while generated and task.folder.exists():  # a generated id never joins an existing task
        task = TaskPaths(s.root, project_id, task_id := new_task_id())
    text = read_prompt(prompt, prompt_file)
    existing = runfolder.read_task_prompt(task)
    if text is None:
        if existing is None:
            raise UsageError('no prompt: give it as an argument, "-" for stdin, or --prompt-file')
        text = validate_prompt(existing, f"the task's prompt in {task.task_md}")
    elif existing is not None and existing != text:
        raise UsageError(
            f"task {project_id}/{task_id} exists with another prompt in {task.task_md}; "
            "use `run-agent resume` or a new --task"
        )
    if generated:
        click.echo(f"run-agent: task id {task_id}", err=True)
    foreground_loop(s, task, text, options)


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str | None:
    """The prompt from the argument, `-` (stdin) or --prompt-file; None if none was given."""
    if prompt is not None and prompt_file is not None:
        raise UsageError("give the prompt either as an argument or with --prompt-file, not both")
    source = "the prompt"
    try:
        if prompt_file is not None:
            source = f"prompt file {str(prompt_file)!r}"
            with open(prompt_file, "rb") as f:
                prompt = _prompt_text(f.read(MAX_PROMPT_BYTES + 1), source)
        elif prompt == "-":
            source = "the prompt on standard input"
            prompt = _prompt_text(sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1), source)
    except UnicodeDecodeError as exc:
        raise UsageError(f"{source} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return None if prompt is None else validate_prompt(prompt, source)


def _prompt_text(data: bytes, source: str) -> str:
    if len(data) > MAX_PROMPT_BYTES:
        raise UsageError(
            f"{source} is larger than {MAX_PROMPT_BYTES >> 20} MiB; is it the right file?"
        )
    return data.decode("utf-8")


def loop_settings(base: LoopSettings, options: dict[str, Any]) -> LoopSettings:
    changes: dict[str, Any] = {}
    if options.get("max_restarts") is not None:
        changes["max_restarts"] = options["max_restarts"]
    for name in ("restart_delay", "timeout", "idle_timeout"):
        if options.get(name) is not None:
            value = parse_duration(options[name], "--" + name.replace("_", "-"))
            changes[name] = value if name != "restart_delay" else (value or 0.0)
    if options.get("until"):
        changes["until"] = Until(options["until"])
    return LoopSettings(**{**base.__dict__, **changes})


def executable_dir() -> Path:
    """The folder of the run-agent being run, so agents can start sub-runs by name."""
    script = Path(sys.argv[0])
    if script.name == "run-agent":
        return script.resolve().parent
    return Path(sys.executable).parent


def foreground_loop(s: Setup, task: TaskPaths, prompt: str, options: dict[str, Any]) -> None:
    agent = s.config.agent(options.get("agent"), backends.known())
    backend = backends.create(agent)
    working_dir = (options.get("working_dir") or Path.cwd()).resolve()
    if not working_dir.is_dir():
        raise UsageError(f"working folder {str(working_dir)!r} does not exist; check --cwd")
    request = LoopRequest(
        task=task,
        prompt=prompt,
        agent_name=agent.name,
        working_dir=working_dir,
        settings=loop_settings(s.config.defaults, options),
        base_env=dict(os.environ),
        parent_run_id=os.environ.get("JRUN_ID") or None,
        executable_dir=executable_dir(),
    )
    console = Console(
        sys.stderr,
        request.settings.max_restarts + 1,
        options.get("quiet", False),
        backend.summarize,
    )
    redactor = backend.redactor(request.base_env)
    notifier = notifier_for(s.config, options.get("schedule"), console.say, redactor)

    def on_event(event: Event) -> None:
        console.show(event)
        if notifier is not None:
            notify_event(notifier, event, task, options.get("schedule"))

    supervisor = Supervisor(request, backend, on_event=on_event, redactor=redactor)
    previous = {
        sig: signal.signal(sig, lambda *_: supervisor.request_stop()) for sig in STOP_SIGNALS
    }
    try:
        result = supervisor.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.finish(result.message, result.outcome)
    if notifier is not None:
        notifier.drain(NOTIFY_DRAIN)
    sys.exit(int(OUTCOME_EXIT[result.outcome]))


def notifier_for(
    config: Config, schedule: str | None, log: Callable[[str], None], redactor: Redactor
) -> notify.Notifier | None:
    settings = config.notify
    if schedule and schedule in config.schedules:
        settings = config.schedules[schedule].notify or settings
    if settings is None:
        return None
    return notify.Notifier(settings, dict(os.environ), log=log, redactor=redactor)


def notify_event(
    notifier: notify.Notifier, event: Event, task: TaskPaths, schedule: str | None
) -> None:
    base = {"project_id": task.project_id, "task_id": task.task_id, "schedule": schedule}
    if event.kind is EventKind.RUN_ENDED and event.run is not None:
        if event.run.status in (RunStatus.FAILED, RunStatus.TIMED_OUT):
            notifier.send(NotifyEvent.FAILED, {**base, "run": event.run.to_dict()})
    elif event.kind is EventKind.LOOP_ENDED and event.outcome is not None:
        if event.outcome is Outcome.COMPLETED:
            notifier.send(NotifyEvent.COMPLETED, {**base, "message": event.message})
        elif event.outcome is not Outcome.STOPPED:
            notifier.send(
                NotifyEvent.GAVE_UP,
                {**base, "outcome": event.outcome.value, "message": event.message},
            )


class Console:
    """What a foreground run shows: a line per event, and in a terminal a live status line."""

    def __init__(
        self,
        stream: TextIO,
        max_attempts: int,
        quiet: bool,
        summarize: Callable[[str], str | None] = lambda line: line,
    ) -> None:
        self.stream = stream
        self.summarize = summarize
        self.max_attempts = max_attempts
        self.quiet = quiet
        self.live = stream.isatty() and not quiet
        self._status_shown = False

    def say(self, text: str) -> None:
        if self.quiet:
            return
        self._clear()
        print(f"run-agent: {text}", file=self.stream, flush=True)

    def _clear(self) -> None:
        if self._status_shown:
            self.stream.write("\r\x1b[K")
            self._status_shown = False

    def show(self, event: Event) -> None:
        info = event.run
        if event.kind is EventKind.RUN_STARTED and info is not None:
            self.say(
                f"attempt {info.attempt}/{self.max_attempts}: run {info.run_id} started "
                f"({info.agent}) in {event.run_folder}"
            )
        elif event.kind is EventKind.RUN_ENDED and info is not None:
            self.say(
                f"attempt {info.attempt}: run {info.run_id} {info.status.value}: {info.message}"
            )
        elif event.kind is EventKind.WAITING:
            note = f"{event.message}; " if event.message else ""
            self.say(f"{note}restarting in {event.delay:g}s")
        elif event.kind in (EventKind.MARKED_LOST, EventKind.DONE_ARCHIVED):
            self.say(event.message or f"run {info.run_id if info else '?'} marked lost")
        elif event.kind is EventKind.TICK and self.live and info is not None:
            self._status(info, event)

    def _status(self, info: RunInfo, event: Event) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        minutes, seconds = divmod(int(event.elapsed), 60)
        head = f"attempt {info.attempt}/{self.max_attempts} · running · {minutes:02d}:{seconds:02d}"
        last = ""
        if event.run_folder is not None:
            lines = runfolder.tail(runfolder.stdout_path(event.run_folder), 8192).splitlines()
            for line in reversed(lines):
                last = (self.summarize(line) or "").strip() if line.strip() else ""
                if last:
                    break
        line = f"{head} · {last}" if last else head
        self.stream.write("\r\x1b[K" + "".join(c for c in line if c.isprintable())[: width - 1])
        self.stream.flush()
        self._status_shown = True

    def finish(self, message: str, outcome: Outcome) -> None:
        self._clear()
        print(f"run-agent: {message}", file=self.stream, flush=True)


# backends, doctor ---------------------------------------------------------------------------


def backend_agents(config: Config) -> list[AgentConfig]:
    """Each configured agent, plus a default one for every backend no agent uses."""
    used = {a.type for a in config.agents.values()}
    defaults = [AgentConfig(name=n, type=n) for n in backends.names() if n not in used]
    return [*config.agents.values(), *defaults]


def print_sections(sections: list[Any]) -> bool:
    for section in sections:
        click.echo(f"{'ok  ' if section.ok else 'FAIL'}  {section.title}")
        for f in section.findings:
            click.echo(
                f"      {'✓' if f.ok else '✗'} {f.what}"
                + (f" — {f.fix}" if f.fix and not f.ok else "")
            )
    return all(s.ok for s in sections)


@cli.command(name="backends")
@json_option
@common
def backends_(as_json: bool, config_path: Path | None, root: Path | None) -> None:
    """List every backend and agent, and whether it can run here."""
    from runagent import doctor

    s = setup(config_path, root)
    sections = [doctor.check_agent(a, backends.create) for a in backend_agents(s.config)]
    if as_json:
        data = [
            {
                "agent": a.name,
                "backend": a.type,
                "usable": sec.ok,
                "checks": [{"ok": f.ok, "what": f.what, "fix": f.fix} for f in sec.findings],
            }
            for a, sec in zip(backend_agents(s.config), sections, strict=True)
        ]
        click.echo(json.dumps(data, indent=2))
        return
    print_sections(sections)


@cli.command(name="doctor")
@click.option("--port", type=click.IntRange(0, 65535), default=14355, show_default=True)
@common
def doctor_(port: int, config_path: Path | None, root: Path | None) -> None:
    """Check config, agent CLIs, versions, keys, the runs root and the server port."""
    from runagent import doctor

    s = setup(config_path, root)
    sections = [doctor.check_python(), doctor.check_config(s.config)]
    sections += [doctor.check_agent(a, backends.create) for a in s.config.agents.values()]
    sections += [
        doctor.check_root(s.root),
        doctor.check_port(port=port),
        doctor.check_environment(),
    ]
    if print_sections(sections):
        click.echo("everything run-agent needs is in place")
        return
    fail("some checks failed; see the lines marked ✗", ExitCode.MISSING_DEPENDENCY)


# serve ------------------------------------------------------------------------------------


@cli.command()
@click.option("--host", help="Address to listen on (default 127.0.0.1; others need an API key).")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default 14355).")
@click.option("--no-schedules", is_flag=True, help="Do not fire the config's schedules.")
@common
def serve(
    host: str | None, port: int | None, no_schedules: bool, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """Serve a live view of every run in a browser (REST, SSE and a page)."""
    import socket

    import uvicorn

    from server.app import Settings, create_app
    from server.security import allowed_hosts, is_loopback

    s = setup(config_path, root)
    host = host or s.config.server.host
    port = port or s.config.server.port
    key = s.config.server.api_key(os.environ)
    if not is_loopback(host) and not key:
        raise UsageError(
            f"refusing to serve on {host}: anything but loopback needs an API key; "
            f"set {s.config.server.api_key_env} and try again"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(
                f"cannot listen on {host}:{port} ({exc.strerror}); pass --port"
            ) from exc
    app = create_app(
        Settings(
            root=s.root,
            api_key=key,
            config_path=s.config.source,
            schedules=s.config.schedules,
            launch=lambda firing: launch_firing(s, firing),
            run_schedules=not no_schedules,
            allowed_hosts=allowed_hosts(host, s.config.server.allowed_hosts),
        )
    )
    enabled = [c.name for c in s.config.schedules.values() if c.enabled]
    if enabled and not no_schedules:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s run-agent: %(message)s"))
        schedule_log = logging.getLogger("run-agent.schedules")
        schedule_log.addHandler(handler)
        schedule_log.setLevel(logging.INFO)
        click.echo(f"run-agent: firing schedules: {', '.join(enabled)}", err=True)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"run-agent: serving {s.root} at http://{shown}:{port}/", err=True)
    click.echo("run-agent: Ctrl-C stops the server; runs it started go on", err=True)
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning")


# schedule ---------------------------------------------------------------------------------


@cli.group()
def schedule() -> None:
    """Cron schedules from config.yaml: list them, run the scheduler, fire one now, or print
    equivalent crontab lines."""


def schedule_named(s: Setup, name: str) -> ScheduleConfig:
    if name not in s.config.schedules:
        known = ", ".join(s.config.schedules) or "none configured"
        raise UsageError(f"unknown schedule {name!r}; schedules: {known}")
    return s.config.schedules[name]


def launch_firing(s: Setup, firing: sched.Firing) -> int:
    """Start a firing's loop as a detached supervisor, after checking its agent can start."""
    from runagent import control

    config = firing.schedule
    agent = s.config.agent(config.agent, backends.known())
    for finding in backends.create(agent).check():
        if not finding.ok:
            hint = f"; {finding.fix}" if finding.fix else ""
            raise MissingDependencyError(f"schedule {config.name}: {finding.what}{hint}")
    if config.prompt_file is not None:
        try:
            prompt = config.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"schedules.{config.name}.prompt_file {str(config.prompt_file)!r} cannot be "
                f"read as text ({exc}); fix the path"
            ) from exc
    else:
        prompt = config.prompt or ""
    validate_prompt(prompt, f"the prompt of schedules.{config.name}")
    task = TaskPaths(s.root, validate_id("project", config.project), firing.task_id)
    existing = runfolder.read_task_prompt(task)
    if existing is not None and existing != prompt:
        raise UsageError(
            f"task {firing.label} exists with another prompt; use {{datetime}} in task"
        )
    runfolder.write_task_prompt(task, prompt)
    args = ["run", "--project", config.project, "--task", firing.task_id, "--root", str(s.root),
            "--schedule", config.name]  # fmt: skip
    if s.config.source is not None:
        args += ["--config", str(s.config.source.resolve())]
    for flag, value in (("--agent", config.agent), ("--max-restarts", config.max_restarts),
                        ("--timeout", config.timeout)):  # fmt: skip
        if value is not None:
            args += [flag, str(value)]
    return control.start_detached(task, args, cwd=Path.cwd()).pid


def scheduler_for(s: Setup, log: Callable[[str], None]) -> sched.Scheduler:
    return sched.Scheduler(
        s.config.schedules, s.root, launch=lambda firing: launch_firing(s, firing), log=log
    )


def stamped(line: str) -> None:
    click.echo(f"{sched.utc_now():%Y-%m-%dT%H:%M:%SZ} {line}")


@schedule.command(name="list")
@click.option(
    "--count",
    type=click.IntRange(0, 1000),
    default=3,
    show_default=True,
    help="How many next firings to show.",
)
@json_option
@common
def schedule_list(count: int, as_json: bool, config_path: Path | None, root: Path | None) -> None:
    """Each schedule with its next firings and what it last did."""
    s = setup(config_path, root)
    rows = sched.describe(s.config.schedules, s.root, sched.utc_now(), count)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no schedules in the config (add a `schedules:` section)", err=True)
    for row in rows:
        state_text = "" if row["enabled"] else " (disabled)"
        click.echo(f"{row['name']}{state_text}: '{row['cron']}' {row['timezone']}, "
                   f"overlap {row['overlap']} -> {row['project']}/{row['task']}")  # fmt: skip
        for moment in row["next"]:
            click.echo(f"  next  {moment}")
        if row["last_fired"]:
            click.echo(f"  last  {row['last_fired']} {row['last_task']}: "
                       f"{row['last_outcome'] or 'running'}")  # fmt: skip


@schedule.command(name="run")
@click.option("--tick", default=15.0, show_default=True, hidden=True)
@common
def schedule_run(tick: float, config_path: Path | None, root: Path | None) -> None:
    """Run the scheduler in the foreground: fire each schedule as a detached supervisor."""
    import threading

    s = setup(config_path, root)
    if not any(c.enabled for c in s.config.schedules.values()):
        raise UsageError("no enabled schedules in the config; add a `schedules:` section")
    scheduler = scheduler_for(s, stamped)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    try:
        scheduler.start(sched.utc_now())
        stamped(f"scheduler started: {', '.join(c.name for c in scheduler.enabled())}")
        while not stop.is_set():
            scheduler.tick(sched.utc_now())
            stop.wait(min(tick, sched.seconds_to_next_minute(sched.utc_now())))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stamped("scheduler stopped; runs it started go on")


@schedule.command(name="now")
@click.argument("name")
@common
def schedule_now(name: str, config_path: Path | None, root: Path | None) -> None:
    """Fire schedule NAME now (what a crontab line runs)."""
    s = setup(config_path, root)
    config = schedule_named(s, name)
    firing = scheduler_for(s, stamped).fire_now(config, sched.utc_now())
    click.echo(f"{firing.label}")


@schedule.command(name="crontab")
@common
def schedule_crontab(config_path: Path | None, root: Path | None) -> None:
    """Print crontab lines equivalent to the config's schedules."""
    import shlex

    s = setup(config_path, root)
    if s.config.source is None:
        raise UsageError("no config file: crontab lines need one (pass --config)")
    launcher = executable_dir() / "run-agent"
    command = [str(launcher)] if launcher.exists() else [sys.executable, "-m", "runagent"]
    config = str(s.config.source.resolve())
    log = s.root / "schedule.log"
    click.echo("# run-agent schedules; install with: run-agent schedule crontab | crontab -")
    click.echo("# CRON_TZ needs a cron that supports it (cronie); others use the system zone.")
    click.echo(f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}")
    for c in s.config.schedules.values():
        if not c.enabled:
            continue
        argv = [*command, "schedule", "now", c.name, "--config", config, "--root", str(s.root)]
        click.echo(f"CRON_TZ={c.timezone}")
        click.echo(f"{c.cron} mkdir -p {shlex.quote(str(s.root))} && "
                   f"cd {shlex.quote(str(Path.cwd()))} && {shlex.join(argv)} "
                   f">> {shlex.quote(str(log))} 2>&1")  # fmt: skip


# stop -------------------------------------------------------------------------------------


@cli.command()
@task_option(required=True)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until it stopped.")
@common
def stop(
    project_id: str, task_id: str, wait: bool, config_path: Path | None, root: Path | None
) -> None:
    """Stop a task's loop: its agent tree is killed and nothing restarts."""
    s, task = existing_task(config_path, root, project_id, task_id)
    label = f"{project_id}/{task_id}"
    if not wait:
        holder = live_holder(task.lock)
        if holder is None:
            click.echo(f"run-agent: task {label} is not running")
            return
        os.kill(holder.pid, signal.SIGTERM)
        click.echo(f"run-agent: asked the supervisor of {label} (pid {holder.pid}) to stop")
        return
    from runagent import control

    stopped = control.stop(task, s.config.defaults.kill_grace + STOP_WAIT_MARGIN)
    if stopped is None:
        click.echo(f"run-agent: task {label} is not running")
        return
    click.echo(f"run-agent: task {label} stopped")


# list, status, output ---------------------------------------------------------------------


def run_dict(info: RunInfo) -> dict[str, Any]:
    return info.to_dict()


def task_dict(view: tasks.TaskView) -> dict[str, Any]:
    return {
        "project_id": view.paths.project_id,
        "task_id": view.paths.task_id,
        "status": view.status.value,
        "runs": view.run_count,
        "latest_run": run_dict(view.latest) if view.latest else None,
        "supervisor_pid": view.supervisor.pid if view.supervisor else None,
        "folder": str(view.paths.folder),
    }


def print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@cli.command(name="list")
@click.option("--project", "-p", "project_id", help="Only this project's tasks.")
@click.option("--task", "-t", "task_id", help="This task's runs (with --project).")
@json_option
@common
def list_(
    project_id: str | None, task_id: str | None, as_json: bool, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """List tasks (all, or one project's), or one task's runs."""
    s = setup(config_path, root)
    if task_id is not None:
        if project_id is None:
            raise UsageError("--task needs --project")
        task = tasks.find_task(
            s.root, validate_id("project", project_id), validate_id("task", task_id)
        )
        found = tasks.runs(task)
        if as_json:
            click.echo(json.dumps([run_dict(r) for r in found], indent=2))
            return
        rows = [
            [
                r.run_id,
                str(r.attempt),
                r.status.value,
                _str(r.exit_code),
                r.reason or "",
                r.start_time,
            ]
            for r in found
        ]
        print_table(rows, ["RUN", "ATTEMPT", "STATUS", "EXIT", "REASON", "STARTED"])
        return
    if project_id is not None:
        validate_id("project", project_id)
        if not (s.root / project_id).is_dir():
            raise NotFoundError(f"project {project_id!r} not found under {s.root}")
    views = tasks.all_tasks(s.root, project_id)
    if as_json:
        click.echo(json.dumps([task_dict(v) for v in views], indent=2))
        return
    if not views:
        click.echo(f"no tasks under {s.root}", err=True)
        return
    rows = [
        [
            v.paths.project_id,
            v.paths.task_id,
            v.status.value,
            str(v.run_count),
            v.latest.run_id if v.latest else "",
        ]
        for v in views
    ]
    print_table(rows, ["PROJECT", "TASK", "STATUS", "RUNS", "LATEST RUN"])


def _str(value: object) -> str:
    return "" if value is None else str(value)


@cli.command()
@task_option(required=True)
@json_option
@common
def status(
    project_id: str, task_id: str, as_json: bool, config_path: Path | None, root: Path | None
) -> None:
    """Show a task's status and its latest run."""
    _, task = existing_task(config_path, root, project_id, task_id)
    view = tasks.view(task)
    if as_json:
        click.echo(json.dumps(task_dict(view), indent=2))
        return
    click.echo(f"task      {view.label}: {view.status.value} ({view.run_count} runs)")
    click.echo(f"folder    {task.folder}")
    if view.supervisor:
        click.echo(f"supervisor pid {view.supervisor.pid} since {view.supervisor.since}")
    if view.latest:
        r = view.latest
        click.echo(f"latest    {r.run_id} attempt {r.attempt}: {r.status.value}")
        for label, value in (
            ("agent", r.agent),
            ("started", r.start_time),
            ("ended", r.end_time),
            ("exit code", r.exit_code),
            ("reason", r.message or r.reason),
            ("pid", r.pid),
        ):
            if value is not None:
                click.echo(f"{label:<9} {value}")


@cli.command()
@task_option(required=True)
@click.option("--run", "run_id", help="Run id (default: the task's latest run).")
@click.option(
    "--file",
    "which",
    type=click.Choice(list(runfolder.RUN_FILES)),
    default="output",
    show_default=True,
)
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing as the task writes, across restarts."
)
@json_option
@common
def output(
    project_id: str, task_id: str, run_id: str | None, which: str, follow: bool, as_json: bool,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Print a run's output, stdout, stderr or prompt."""
    if run_id is not None:
        validate_id("run", run_id)
    _, task = existing_task(config_path, root, project_id, task_id)
    run_id = run_id or _latest_run_id(task)
    folder = task.run_folder(run_id)
    if not folder.is_dir():
        raise NotFoundError(f"run {run_id!r} of task {project_id}/{task_id} not found")
    path = folder / runfolder.RUN_FILES[which]
    if as_json:
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        click.echo(
            json.dumps({"run_id": run_id, "file": which, "path": str(path), "content": text})
        )
        return
    if not follow:
        _copy_to_stdout(path, 0)
        return
    for chunk in follow_task(task, run_id, runfolder.RUN_FILES[which]):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()


def _latest_run_id(task: TaskPaths) -> str:
    ids = task.run_ids()
    if not ids:
        raise NotFoundError(f"task {task.project_id}/{task.task_id} has no runs yet")
    return ids[-1]


def _copy_to_stdout(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while chunk := f.read(1 << 16):
                sys.stdout.buffer.write(chunk)
                offset += len(chunk)
    except FileNotFoundError:
        pass
    sys.stdout.buffer.flush()
    return offset


def follow_task(task: TaskPaths, run_id: str, name: str, interval: float = 0.2) -> Iterator[bytes]:
    """The bytes of `name` in run `run_id` as they are written, then in each following run."""
    offset = 0
    while True:
        path = task.run_folder(run_id) / name
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                while chunk := f.read(1 << 16):
                    offset += len(chunk)
                    yield chunk
        except FileNotFoundError:
            pass
        folder = task.run_folder(run_id)
        info = runfolder.read_run_info(folder)
        if info is not None and tasks.effective(info, folder).status is not RunStatus.RUNNING:
            later = [r for r in task.run_ids() if r > run_id]
            if later:
                run_id, offset = later[0], 0
                continue
            if live_holder(task.lock) is None and _drained(path, offset):
                return
        time.sleep(interval)


def _drained(path: Path, offset: int) -> bool:
    try:
        return path.stat().st_size <= offset
    except FileNotFoundError:
        return True


def main() -> None:
    cli(prog_name="run-agent")
