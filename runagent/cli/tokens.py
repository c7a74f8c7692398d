"""token: scoped API tokens for `run-agent serve` (runagent/store/tokens.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import click

from runagent.cli.group import cli
from runagent.cli.options import common, setup
from runagent.cli.show import print_table
from runagent.duration import parse_duration
from runagent.errors import UsageError
from runagent.loop.context import validate_id
from runagent.store import tokens


@cli.group()
def token() -> None:
    """Scoped API tokens for the server: create one (shown once), list them, revoke one."""


@token.command()
@click.option(
    "--scope", required=True, type=click.Choice(["read", "operate", "admin"]),
    help="read: see; operate: also start, stop, resume, answer; admin: also delete.",
)  # fmt: skip
@click.option(
    "--project", "-p", "projects", multiple=True,
    help="Only this project (repeatable; default: every project).",
)  # fmt: skip
@click.option("--expires", help="How long it is good for, e.g. 30d (default: until revoked).")
@click.option("--note", default="", help="What it is for, shown by `token list` (e.g. CI of app).")
@click.option(
    "--link", is_flag=True,
    help="Print the page's address with the token (/?key=TOKEN, as config.yaml's server: says "
    "it is served) to open in a browser, instead of the token alone.",
)  # fmt: skip
@common
def create(
    scope: str, projects: tuple[str, ...], expires: str | None, note: str, link: bool,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Make a token; it is printed once, and only its hash is kept."""
    s = setup(config_path, root)
    for project in projects:
        validate_id("project", project)
    seconds = None
    if expires is not None:
        seconds = parse_duration(expires, "--expires", none="or leave it out: until revoked")
        if seconds is None:
            raise UsageError(f"--expires {expires!r} is no time; give e.g. 30d, or leave it out")
    if "\n" in note or len(note) > 200:
        raise UsageError("--note is one line of at most 200 characters")
    secret, made = tokens.create(s.root, tokens.Scope.named(scope), projects, seconds, note=note)
    click.echo(f"{s.config.server.page()}?key={secret}" if link else secret)
    limited = f" for {', '.join(made.projects)}" if made.projects else ""
    ends = f", until {made.expires}" if made.expires else ""
    use = ("open the address once in a browser, which keeps the token in a cookie" if link
           else "send it as Authorization: Bearer TOKEN")  # fmt: skip
    click.echo(f"run-agent: token {made.id} ({scope}{limited}{ends}); it is shown only this "
               f"once: {use}", err=True)  # fmt: skip


@token.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="As JSON (never the hashes).")
@common
def list_(as_json: bool, config_path: Path | None, root: Path | None) -> None:
    """The tokens: id, scope, projects, when made and until when, and whether still good."""
    s = setup(config_path, root)
    now = datetime.now(UTC)
    rows = tokens.read(s.root)
    if as_json:
        shown = [{**{k: v for k, v in r.to_dict().items() if k != "sha256"},
                  "state": r.state(now)} for r in rows]  # fmt: skip
        click.echo(json.dumps(shown, indent=1))
        return
    if not rows:
        click.echo("no tokens; make one with `run-agent token create --scope read`")
        return
    print_table(
        [[r.id, r.scope.word, ",".join(r.projects) or "*", r.created,
          r.expires or "no expiry", r.state(now), r.note] for r in rows],
        ["ID", "SCOPE", "PROJECTS", "CREATED", "EXPIRES", "STATE", "NOTE"],
    )  # fmt: skip


@token.command()
@click.argument("token_id")
@common
def revoke(token_id: str, config_path: Path | None, root: Path | None) -> None:
    """Revoke a token by its id: it is refused from now on."""
    s = setup(config_path, root)
    done = tokens.revoke(s.root, token_id)
    click.echo(f"run-agent: token {done.id} revoked")
