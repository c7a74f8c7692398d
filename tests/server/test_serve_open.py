"""A server with neither a key nor a token lets in every process of the machine, a sandboxed
agent with the host's network among them: `serve` refuses to be that while its config runs one."""

from __future__ import annotations

import yaml

from runagent.errors import ExitCode
from runagent.store import tokens
from tests.conftest import Workspace, free_port


def sandboxed(ws: Workspace, **agent: object) -> None:
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"].update({"sandbox": "bwrap", **agent})
    ws.config.write_text(yaml.safe_dump(data))


def test_serve_without_a_key_is_refused_while_a_sandboxed_agent_has_the_network(
    ws: Workspace,
) -> None:
    sandboxed(ws)
    port = str(free_port())
    refused = ws.cli("serve", "--port", port, env={"RUN_AGENT_API_KEY": ""}, timeout=30)
    assert refused.returncode == ExitCode.USAGE, refused.stderr
    line = refused.stderr.strip()
    assert "agent fake runs sandboxed with the host's network" in line and "\n" not in line
    assert "RUN_AGENT_API_KEY" in line and "run-agent token create" in line


def test_a_key_a_token_or_no_network_lets_it_serve(ws: Workspace) -> None:
    from tests.conftest import serving

    sandboxed(ws, network=False)
    with serving(ws, env={"RUN_AGENT_API_KEY": ""}):
        pass
    sandboxed(ws, network=True)
    with serving(ws, env={"RUN_AGENT_API_KEY": "k" * 40}):
        pass
    tokens.create(ws.root, tokens.Scope.READ)
    with serving(ws, env={"RUN_AGENT_API_KEY": ""}):
        pass
