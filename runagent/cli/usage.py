"""usage: what the runs under the runs root spent, by project, task, agent or day."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import click

from runagent.cli.group import cli
from runagent.cli.options import common, json_option, setup
from runagent.cli.show import print_table
from runagent.duration import parse_duration
from runagent.errors import ConfigError, UsageError
from runagent.loop.context import validate_id
from runagent.store import spend
from runagent.store.spend import GroupBy, Spend


def since_value(value: str | None) -> datetime | date | None:
    """`--since 7d` (a duration back from now) or `--since 2026-11-01` (a UTC day)."""
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        pass
    try:
        seconds = parse_duration(value, "--since")
    except ConfigError as exc:
        raise UsageError(
            f"--since {value!r} is neither a duration (7d, 12h) nor a day (2026-11-01)"
        ) from exc
    return datetime.now(UTC) - timedelta(seconds=seconds or 0)


NOT_REPORTED = "not reported"  # what no agent of a group said: never shown as 0 or free


def _row(group: Spend) -> dict[str, object]:
    used = group.used.to_dict()
    if not group.reported:  # no run of it said: its tokens are not known, not 0
        used = {**used, "tokens_in": None, "tokens_out": None}
    return {"runs": group.runs, "reported": group.reported, **used}


def _cells(group: Spend) -> list[str]:
    """A group's runs, tokens and cost; what its agents did not say reads "not reported"."""
    used = group.used
    cost = NOT_REPORTED if used.cost_usd is None else f"${used.cost_usd:.4f}"
    if not group.reported:
        return [str(group.runs), NOT_REPORTED, NOT_REPORTED, NOT_REPORTED]
    return [str(group.runs), str(used.tokens_in), str(used.tokens_out), cost]


@cli.command()
@click.option("--by", "by", type=click.Choice([g.value for g in GroupBy]), multiple=True,
              help="Sum by this (repeat for several, e.g. --by project --by day); "
              "default: project.")  # fmt: skip
@click.option("--since", help="Only runs started since: a duration back from now (7d) or a day.")
@click.option("--project", "-p", "project_id", help="Only this project's runs.")
@json_option
@common
def usage(
    by: tuple[str, ...], since: str | None, project_id: str | None, as_json: bool,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Tokens and cost of the runs, as their agents reported them, summed by project, task,
    agent or day (UTC), with a total."""
    s = setup(config_path, root)
    groups_by = tuple(GroupBy(b) for b in by) or (GroupBy.PROJECT,)
    after = since_value(since)
    project = validate_id("project", project_id) if project_id else None
    groups, total = spend.summed(spend.runs(s.root, project, after), groups_by, after)
    names = [b.value for b in groups_by]
    if as_json:
        rows = [{**dict(zip(names, g.key, strict=True)), **_row(g)} for g in groups]
        click.echo(json.dumps({"by": names, "rows": rows, "total": _row(total)}, indent=2))
        return
    if not groups:
        click.echo(f"run-agent: no runs {s.where()}" + (f" since {since}" if since else ""),
                   err=True)  # fmt: skip
        return
    table = [[*g.key, *_cells(g)] for g in groups]
    table.append(["total", *[""] * (len(names) - 1), *_cells(total)])
    print_table(table, [*names, "runs", "tokens in", "tokens out", "cost"])
    if total.reported < total.runs:
        silent = total.runs - total.reported
        click.echo(f"run-agent: {silent} of {total.runs} runs reported no usage (their agent "
                   "does not say it); the sums leave them out", err=True)  # fmt: skip
