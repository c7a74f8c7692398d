"""Scoped API tokens: who may use `run-agent serve` besides the one `api_key`, with what scope
and for which projects. A token is shown once, when it is made; only its SHA-256 is kept, in
`.tokens/tokens.json` under the runs root (readable by its owner only). A token carries 256 bits
of randomness, so a fast hash is enough: nothing about it can be guessed from the hash.

    read     sees: every GET, the streams, /metrics
    operate  also starts, stops, resumes, merges, answers approvals and paste replies
    admin    also deletes and runs gc (and so everything the single api_key may do)

A token limited to projects reaches only those: their routes, and listings (the fleet too) that
show nothing else; a view of the whole root that cannot be cut to them (the metrics) is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from runagent.errors import ForbiddenError, NotFoundError, UsageError
from runagent.record import record
from runagent.store.credentials import TOKEN
from runagent.store.runfolder import atomic_write

FOLDER = ".tokens"
FILE = "tokens.json"
PREFIX = "rat"  # run-agent token: rat_<id>_<secret>


class Scope(enum.IntEnum):
    READ = 1
    OPERATE = 2
    ADMIN = 3

    @classmethod
    def named(cls, name: str) -> Scope:
        try:
            return cls[name.upper()]
        except KeyError:
            raise UsageError(f"scope {name!r} is not one of read, operate, admin") from None

    @property
    def word(self) -> str:
        return self.name.lower()


@record
class Grant:
    """What a request may do: its scope, and the projects it may reach (None: all)."""

    scope: Scope
    projects: frozenset[str] | None = None
    token_id: str = ""  # "" for the api_key or an open server

    def reaches(self, project: str) -> bool:
        return self.projects is None or project in self.projects

    def reach(self, *projects: str) -> None:
        """A ForbiddenError (403) unless this grant reaches every one of `projects`."""
        for project in projects:
            if not self.reaches(project):
                raise ForbiddenError(f"this token does not reach project {project[:100]!r}")

    def require(self, needs: Scope, what: str) -> None:
        """A ForbiddenError (403) unless this grant's scope is at least `needs` for `what`."""
        if self.scope < needs:
            raise ForbiddenError(f"this token's scope is {self.scope.word}; {what} needs "
                                 f"{needs.word}")  # fmt: skip


ADMIN = Grant(Scope.ADMIN)  # the api_key, or a server that asks for no key


@record
class TokenRecord:
    id: str
    sha256: str
    scope: Scope
    projects: tuple[str, ...]
    created: str
    expires: str | None = None
    revoked: str | None = None
    note: str = ""  # what it is for ("CI of app"), as its maker said

    def state(self, now: datetime) -> str:
        if self.revoked:
            return "revoked"
        if self.expires and datetime.fromisoformat(self.expires) <= now:
            return "expired"
        return "active"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "sha256": self.sha256, "scope": self.scope.word,
                "projects": list(self.projects), "created": self.created,
                "expires": self.expires, "revoked": self.revoked, "note": self.note}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenRecord:
        return cls(
            str(data["id"]), str(data["sha256"]), Scope.named(str(data["scope"])),
            tuple(str(p) for p in data.get("projects") or ()), str(data["created"]),
            data.get("expires"), data.get("revoked"), str(data.get("note") or ""),
        )  # fmt: skip


def path(root: Path) -> Path:
    return root / FOLDER / FILE


def read(root: Path) -> list[TokenRecord]:
    try:
        data = json.loads(path(root).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"the token file {path(root)} cannot be read ({exc}); fix or remove it"
        ) from None
    try:
        return [TokenRecord.from_dict(d) for d in data.get("tokens", []) if isinstance(d, dict)]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"the token file {path(root)} holds a record that is not one ({exc!r}); fix or "
            "remove it"
        ) from None


@contextlib.contextmanager
def _changing(root: Path) -> Iterator[list[TokenRecord]]:
    """The records, to change in place and write back, with the token file's lock held: a
    revocation and a creation at the same moment both land."""
    folder = root / FOLDER
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        records = read(root)
        yield records
        atomic_write(path(root), json.dumps({"tokens": [r.to_dict() for r in records]}, indent=1))
        os.chmod(path(root), 0o600)
    finally:
        os.close(fd)


def digest(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()


def create(
    root: Path, scope: Scope, projects: Iterable[str] = (), expires: float | None = None,
    now: datetime | None = None, note: str = "",
) -> tuple[str, TokenRecord]:  # fmt: skip
    """A new token (shown once) and its record, stored by its hash."""
    import secrets

    now = now or datetime.now(UTC)
    token_id = secrets.token_hex(6)
    token = f"{PREFIX}_{token_id}_{secrets.token_urlsafe(32)}"
    ends = (now + timedelta(seconds=expires)).isoformat(timespec="seconds") if expires else None
    made = TokenRecord(token_id, digest(token), scope, tuple(sorted(set(projects))),
                       now.isoformat(timespec="seconds"), ends, note=note)  # fmt: skip
    with _changing(root) as records:
        records.append(made)
    return token, made


def revoke(root: Path, token_id: str, now: datetime | None = None) -> TokenRecord:
    with _changing(root) as records:
        at = next((i for i, r in enumerate(records) if r.id == token_id), None)
        if at is None:
            raise NotFoundError(f"no token {token_id[:40]!r}; see `run-agent token list`")
        when = (now or datetime.now(UTC)).isoformat(timespec="seconds")
        records[at] = dataclasses.replace(records[at], revoked=records[at].revoked or when)
        return records[at]


def verify(records: Iterable[TokenRecord], presented: str, now: datetime) -> Grant | None:
    """The grant of a presented token, or None if it is none of the active ones (compared in
    constant time, by hash)."""
    import hmac

    match = TOKEN.fullmatch(presented)
    if match is None:
        return None
    wanted = digest(presented)
    for found in records:
        if hmac.compare_digest(found.sha256, wanted) and found.id == match[1]:
            if found.state(now) != "active":
                return None
            projects = frozenset(found.projects) if found.projects else None
            return Grant(found.scope, projects, found.id)
    return None
