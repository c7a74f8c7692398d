"""worktrees and cocode: issue runs' git worktrees, and run-agent as a cocode agent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from runagent import worktree
from runagent.cli.group import cli
from runagent.cli.options import common, json_option, setup
from runagent.cli.show import print_table
from runagent.errors import UsageError


@cli.command()
@click.argument("action", type=click.Choice(["list", "prune"]), default="list")
@click.option(
    "--all", "every", is_flag=True, help="prune: every task not running, not only completed ones."
)
@click.option("--force", is_flag=True, help="prune: dirty worktrees too, their diff saved first.")
@json_option
@common
def worktrees(
    action: str, every: bool, force: bool, as_json: bool, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """List issue runs' worktrees, or prune those whose tasks are done with them."""
    s = setup(config_path, root)
    env = dict(os.environ)
    found = worktree.issue_worktrees(s.root, env)
    if action == "list":
        if every or force:
            raise UsageError("--all and --force go with `run-agent worktrees prune`")
        if as_json:
            click.echo(json.dumps([w.to_dict() for w in found], indent=2))
            return
        if not found:
            click.echo(f"run-agent: no issue worktrees {s.where()}", err=True)
            return
        rows = [
            [w.task.label, w.task.status.value, w.branch or "", _ahead(w), _state(w), str(w.path)]
            for w in found
        ]
        print_table(rows, ["TASK", "STATUS", "BRANCH", "AHEAD", "STATE", "PATH"])
        return
    results = [worktree.prune(w, env, every=every, force=force) for w in found]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        **p.worktree.to_dict(),
                        "action": p.action.value,
                        "saved_diff": str(p.saved_diff) if p.saved_diff else None,
                        "branch_deleted": p.branch_deleted,
                    }
                    for p in results
                ],
                indent=2,
            )
        )
        return
    for pruned in results:
        click.echo(pruned.describe())
    if not results:
        click.echo(f"run-agent: no issue worktrees {s.where()}", err=True)


def _ahead(w: worktree.IssueWorktree) -> str:
    return "" if w.ahead is None else str(w.ahead)


def _state(w: worktree.IssueWorktree) -> str:
    if not w.registered:
        return "unregistered" if w.path.exists() else "missing"
    words = ["dirty" if w.dirty else "clean"]
    if w.locked is not None:
        words.append("locked")
    return ",".join(words)
