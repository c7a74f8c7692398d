"""A small SSE client for the tests: parses the wire format exactly, over httpx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Message:
    event: str
    data: str
    id: str | None

    def json(self) -> object:
        return json.loads(self.data)


def parse(lines: Iterator[str]) -> Iterator[Message]:
    """SSE messages from the response's lines; comments (heartbeats) are skipped."""
    event, data, last_id = "message", [], None
    for line in lines:
        if line == "":
            if data:
                yield Message(event, "\n".join(data), last_id)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            last_id = value


def stream(
    url: str, headers: dict[str, str] | None = None, timeout: float = 30
) -> Iterator[Message]:
    """Connect and yield messages until the server ends the stream (or the caller stops)."""
    with (
        httpx.Client(timeout=httpx.Timeout(timeout)) as client,
        client.stream("GET", url, headers=headers or {}) as response,
    ):
        response.raise_for_status()
        yield from parse(response.iter_lines())
