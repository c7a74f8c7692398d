"""fleet: the fleet at a glance, as the page's first view shows it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from runagent.cli.group import cli
from runagent.cli.options import common, json_option, setup
from runagent.fleet.overview import Overview, Spent, overview


@cli.command()
@json_option
@common
def fleet(as_json: bool, config_path: Path | None, root: Path | None) -> None:
    """The fleet at a glance: what runs, the queue in order, today's spend against each
    budget, what needs a person."""
    s = setup(config_path, root)
    found = overview(s.root, s.config.limits, s.config.budgets)
    if as_json:
        click.echo(json.dumps(found.to_dict(), indent=2))
        return
    for line in describe(found):
        click.echo(line)


def describe(found: Overview) -> list[str]:
    c = found.counts
    cap = found.limits.max_running
    lines = [
        f"{c['running']} running · {c['queued']} queued"
        + (f" (max_running {cap})" if cap is not None else "")
        + f" · {c['blocked']} blocked · {c['needs_person']} need a person · {c['tasks']} tasks"
    ]
    queued = [v for v in found.queue if v.queue is not None and not v.queue.blocked]
    blocked = [v for v in found.queue if v.queue is not None and v.queue.blocked]
    if queued:
        lines.append("queue, in the order it starts:")
        lines += [
            f"  {n}. {v.label}  {v.queue.waits_for}" for n, v in enumerate(queued, 1) if v.queue
        ]
    if blocked:
        lines.append("blocked:")
        lines += [f"  {v.label}  {v.queue.waits_for}" for v in blocked if v.queue]
    lines.append(f"spent today ({found.day}, UTC):")
    lines += [f"  {s.what}: {spent_words(s)}" for s in found.spent]
    if found.needs:
        lines.append("needs a person:")
        for need in found.needs:
            lines += [f"  {need.label}  {need.waits_for}: {need.message}", f"    {need.answer}"]
    return lines


def spent_words(spent: Spent) -> str:
    used = spent.used
    words = f"{used.tokens_in + used.tokens_out:,} tokens"
    if used.cost_usd is not None:
        words += f", ${used.cost_usd:.2f}"
    if spent.budget is not None:
        words += f" of {spent.budget.words()}"
        if spent.to_dict()["spent"]:
            words += " (spent: no new start today)"
    return words
