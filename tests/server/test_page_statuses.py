"""The page knows every status a task can have: its status filter offers each one (a status
added to the store and missing from the page cannot be filtered on, as queued, blocked and a
budget's stop once could not)."""

from __future__ import annotations

from html.parser import HTMLParser

from runagent.store.tasks import TaskStatus
from server.assets import STATIC


class _Options(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.values: list[str] = []
        self._value: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "select":
            self.inside = found.get("id") == "status-filter"
        elif tag == "option" and self.inside:
            self._value = found.get("value")

    def handle_data(self, data: str) -> None:
        if self._value is None and self.inside and self.lasttag == "option" and data.strip():
            self.values.append(data.strip())
            self._value = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "option" and self.inside:
            if self._value:
                self.values.append(self._value)
            self._value = None
        elif tag == "select":
            self.inside = False


def test_the_status_filter_offers_every_task_status() -> None:
    parser = _Options()
    parser.feed((STATIC / "index.html").read_text(encoding="utf-8"))
    offered = [v for v in parser.values if v]
    assert sorted(offered) == sorted(s.value for s in TaskStatus)
