"""Start-up: each command imports what it uses, and `--help` and completion still list every
command with its short help. Guarded by what gets imported, never by a stopwatch."""

from __future__ import annotations

import importlib
import pkgutil

import click

import runagent.cli
from runagent.cli.group import LAZY, cli


def test_the_lazy_table_names_every_command_with_its_own_short_help() -> None:
    for module in pkgutil.iter_modules(runagent.cli.__path__):
        importlib.import_module(f"runagent.cli.{module.name}")  # registers all there is
    assert set(cli.commands) == set(LAZY)
    context = click.Context(cli)
    for name, lazy in LAZY.items():
        command = cli.get_command(context, name)
        assert command is not None and command.callback is not None, name
        assert command.callback.__module__ == lazy.module, name
        for width in (20, 45, 60, 80, 200):
            table = click.Command(name, help=lazy.short_help).get_short_help_str(width)
            assert table == command.get_short_help_str(width), (name, width)
