"""How an agent's stdout lines read has one owner, its backend (`Backend.lines`): the server tells
the page each backend's rules, and the page's files spell no agent's event format."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import backends
from runagent.errors import RunAgentError
from runagent.loop.lines import PLACE, checked
from server.app import STATIC, Settings, create_app
from tests.conftest import LOCAL, Workspace

# Words an agent's rules use that are run-agent's own too: the kinds the page draws parts as,
# and names of the page's own data and elements (a run's status, message and exit_code, an
# error's text, a schedule's name, an input's type, a run file's name...). Any other word of a
# backend's rules spelled in the page is an agent's format known a second time.
OWN_WORDS = {"assistant", "tool", "error", "result", "meta"} | {
    "command", "exit_code", "input", "message", "model", "name", "output", "status", "text",
    "type",
}  # fmt: skip


def words(rules: list[dict[str, Any]]) -> Iterator[str]:
    """Every field name and every value the rules name."""
    for rule in rules:
        for path, value in rule["when"].items():
            yield from path.split(".")
            if isinstance(value, str):
                yield value
        for path in [*rule["has"], *([rule["each"]] if "each" in rule else [])]:
            yield from path.split(".")
        for _, text in rule.get("show", []):
            for inside in re.findall(PLACE, text):
                for path in inside.split("|"):
                    yield from path.split(".")
        yield from words(rule.get("rules", []))


# The agents whose event formats the page once spelled itself. A backend added later is not
# looked at here: its words may be the page's own (a fleet row's `answer`), and adding one touches
# no test of the page. That the page knows no format at all, the browser shows (tests/e2e: a
# stream of their events from an agent whose backend states no rules reads as written).
SPELLED_ONCE = ("claude", "codex", "gemini")


def agent_words() -> set[str]:
    found = {w for name in SPELLED_ONCE for w in words(checked(backends.lines_of(name), name))}
    return found - OWN_WORDS


def spelled(word: str, text: str) -> bool:
    """Whether `text` uses `word` as code does: a property (`.word`, `?.word`, `["word"]`) or a
    string of its own (`"word"`, `'word'`, `` `word` ``)."""
    return bool(re.search(r"""(?:\.|\[["'`]|["'`])""" + re.escape(word) + r"(?![\w.-])", text))


def test_the_pages_files_spell_no_agents_event_format() -> None:
    distinct = agent_words()
    # The three CLIs' streams are described, so their telling words are among those looked for.
    assert {"tool_use", "is_error", "agent_message", "turn.failed", "tool_name"} <= distinct
    found = {
        (path.name, word)
        for path in sorted(STATIC.iterdir())
        for word in sorted(distinct)
        if spelled(word, path.read_text(encoding="utf-8", errors="replace"))
    }
    assert not found, (
        f"the page spells an agent's event format ({sorted(found)}): it belongs in the "
        "backend's `lines`, which the page is told (a word that is the page's own: OWN_WORDS)"
    )


def test_the_check_of_spelling_sees_code_and_not_prose() -> None:
    assert spelled("tool_use", 'if (b.type === "tool_use")')
    assert spelled("is_error", "b.is_error ? 1 : 0") and spelled("is_error", 'ev?.["is_error"]')
    assert spelled("turn.failed", "`turn.failed`")
    assert not spelled("tool_use", "// a tool_use, described") and not spelled("item", ".items")


@pytest.mark.parametrize("name", sorted(backends.BUILTIN))
def test_every_backends_lines_are_well_made(name: str) -> None:
    rules = checked(backends.lines_of(name), name)
    assert rules or name not in SPELLED_ONCE


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ({"when": {}}, "lines is dict, not a list of rules"),
        ([{"when": {}, "show": [("blue", "x")]}], "lines[0].show[0]: kind 'blue' is none of"),
        ([{"show": [("tool", "{a b}")]}], "lines[0].show[0] {a b}: 'a b' is not a PATH"),
        ([{"show": [("tool", "x } y")]}], "'x } y' has a brace outside a {PATH}"),
        ([{"each": "list", "show": []}], "lines[0] needs either `show`, or `each` with `rules`"),
        ([{"each": "l", "rules": [{"has": "x", "show": []}]}], "lines[0].rules[0].has is str"),
        ([{"when": {"a": [1]}, "show": []}], "lines[0].when['a'] is list, not a JSON scalar"),
        ([{"shows": []}], "lines[0] has 'shows', which a rule does not take"),
    ],
)
def test_lines_not_well_made_are_refused_saying_where(lines: object, said: str) -> None:
    with pytest.raises(RunAgentError) as refused:
        checked(lines, "mine")
    assert "backend 'mine' states how its lines read wrongly: " in str(refused.value)
    assert said in str(refused.value) and "fix its `lines`" in str(refused.value)


@pytest.fixture
def client(ws: Workspace) -> Iterator[TestClient]:
    app = create_app(Settings(root=ws.root, backend_lines=backends.lines_of))
    with TestClient(app, base_url=LOCAL) as c:
        yield c


def test_the_page_is_told_how_each_backends_lines_read(client: TestClient) -> None:
    claude = client.get("/api/backends/claude/lines")
    assert claude.status_code == 200
    assert claude.json() == {"backend": "claude", "rules": checked(backends.lines_of("claude"), "")}
    assert client.get("/api/backends/command/lines").json() == {"backend": "command", "rules": []}
    unknown = client.get("/api/backends/nope/lines")
    assert unknown.status_code == 404
    assert unknown.json()["error"].startswith("unknown backend 'nope'; known: chat_completions")


def test_a_server_told_nothing_of_the_backends_shows_lines_as_written(ws: Workspace) -> None:
    with TestClient(create_app(Settings(root=ws.root)), base_url=LOCAL) as c:
        assert c.get("/api/backends/claude/lines").json() == {"backend": "claude", "rules": []}
