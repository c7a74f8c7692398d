"""mcp: run-agent as a Model Context Protocol server over stdio (server/mcptools.py), for an
assistant that hands off long tasks and checks on them."""

from __future__ import annotations

from pathlib import Path

from runagent.cli.group import cli
from runagent.cli.options import common, service_for, setup


@cli.command()
@common
def mcp(config_path: Path | None, root: Path | None) -> None:
    """Serve the MCP tools (start, list, status, output, stop, resume, approve, paste reply) and
    the run files over stdio."""
    import anyio

    from server import mcptools

    s = setup(config_path, root)
    tools = mcptools.Tools(service_for(s), s.root, Path.cwd())
    anyio.run(mcptools.serve_stdio, tools)
