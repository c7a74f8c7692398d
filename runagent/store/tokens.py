"""Scoped API tokens: who may use `run-agent serve` besides the one `api_key`, with what scope
and for which projects. A token is shown once, when it is made; only its SHA-256 is kept, in
`.tokens/tokens.json` under the runs root (readable by its owner only). A token carries 256 bits
of randomness, so a fast hash is enough: nothing about it can be guessed from the hash.

    read     sees: every GET, the streams, /metrics
    operate  also starts, stops, resumes, merges, answers approvals and paste replies
    admin    also deletes and runs gc (and so everything the single api_key may do)

A token limited to projects reaches only those: their routes, and listings (the fleet too) that
show nothing else; a view of the whole root that cannot be cut to them (the metrics) is refused.

The file is read within FILE_CAP and every field of every record checked as it is read, so a
file that cannot be read is one error saying why (TokenFileError), never a token that breaks a
request later; a file that cannot be read is never written over (its tokens would be lost).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from runagent.errors import ForbiddenError, NotFoundError, UsageError, shown
from runagent.record import record
from runagent.store import jsonfile
from runagent.store.credentials import TOKEN
from runagent.store.runfolder import atomic_write, exclusive

FOLDER = ".tokens"
FILE = "tokens.json"
PREFIX = "rat"  # run-agent token: rat_<id>_<secret>
FILE_CAP = 4 * 1024 * 1024  # bytes of the token file: some fourteen thousand tokens
SHA256 = re.compile(r"[0-9a-f]{64}")


class TokenFileError(UsageError):
    """The token file is there but cannot be read; `why` says why, without its path."""

    def __init__(self, file: Path, why: str) -> None:
        super().__init__(f"the token file {file} cannot be read: {why}; fix it, or move it "
                         "aside and make the tokens again")  # fmt: skip
        self.why = why


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
    """One scoped token as the token file keeps it: its hash, never the secret."""

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
        if self.expires and _instant(self.expires, "expires") <= now:
            return "expired"
        return "active"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "sha256": self.sha256, "scope": self.scope.word,
                "projects": list(self.projects), "created": self.created,
                "expires": self.expires, "revoked": self.revoked, "note": self.note}  # fmt: skip

    @classmethod
    def from_dict(cls, data: object) -> TokenRecord:
        """The record `data` holds; ValueError naming the first field that is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"{shown(data)} is not an object")
        scope = data.get("scope")
        if not isinstance(scope, str) or scope.upper() not in Scope.__members__:
            raise ValueError(f"scope {shown(scope)} is not read, operate or admin")
        projects = data.get("projects") or []
        if not isinstance(projects, list) or not all(isinstance(p, str) for p in projects):
            raise ValueError(f"projects {shown(projects)} is not a list of project ids")
        expires, revoked = data.get("expires"), data.get("revoked")
        if expires is not None:
            _instant(expires, "expires")
        if revoked is not None and not isinstance(revoked, str):
            raise ValueError(f"revoked {shown(revoked)} is not a time")
        sha256 = _string(data, "sha256")
        if not SHA256.fullmatch(sha256):
            raise ValueError(f"sha256 {shown(sha256)} is not a SHA-256 in hex")
        return cls(
            _string(data, "id"), sha256, Scope[scope.upper()], tuple(projects),
            _string(data, "created"), expires, revoked, _string(data, "note", ""),
        )  # fmt: skip


def _string(data: dict[str, Any], name: str, default: str | None = None) -> str:
    value = data.get(name) if data.get(name) is not None else default
    if not isinstance(value, str):
        raise ValueError(f"{name} {shown(value)} is not a string")
    return value


def _instant(value: object, name: str) -> datetime:
    """A time as the file keeps it: ISO 8601 with its zone (one without would be compared with
    the server's clock in no zone at all)."""
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        raise ValueError(f"{name} {shown(value)} is not a time (ISO 8601, with its zone)")
    if when.tzinfo is None:
        raise ValueError(f"{name} {shown(value)} has no time zone (write it as {value}+00:00)")
    return when


def path(root: Path) -> Path:
    return root / FOLDER / FILE


def read(root: Path) -> list[TokenRecord]:
    """The token records ([] without a token file); TokenFileError saying why if the file
    cannot be read whole, or any record in it is not one."""
    file = path(root)
    try:
        data = jsonfile.read_object(file, FILE_CAP)
    except FileNotFoundError:
        return []
    except jsonfile.Unreadable as exc:
        raise TokenFileError(file, str(exc)) from None
    listed = data.get("tokens", [])
    if not isinstance(listed, list):
        raise TokenFileError(file, f"tokens {shown(listed)} is not a list")
    records = []
    for n, item in enumerate(listed, 1):
        try:
            records.append(TokenRecord.from_dict(item))
        except ValueError as exc:
            raise TokenFileError(file, f"its token {n}: {exc}") from None
    return records


@contextlib.contextmanager
def _changing(root: Path) -> Iterator[list[TokenRecord]]:
    """The records, to change in place and write back, with the token file's lock held: a
    revocation and a creation at the same moment both land."""
    folder = root / FOLDER
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    with exclusive(folder / "lock"):
        records = read(root)  # one that cannot be read is never written over
        yield records
        text = json.dumps({"tokens": [r.to_dict() for r in records]}, indent=1)
        if len(text.encode()) > FILE_CAP:
            raise UsageError(
                f"the token file {path(root)} would be {jsonfile.over(FILE_CAP, len(text))} "
                f"with {len(records)} tokens, revoked ones too; take old ones out of it by hand"
            )
        atomic_write(path(root), text)
        os.chmod(path(root), 0o600)


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
    for found in records:  # the id is no secret: only the hash is compared in constant time
        if found.id == match[1] and hmac.compare_digest(found.sha256, wanted):
            if found.state(now) != "active":
                return None
            projects = frozenset(found.projects) if found.projects else None
            return Grant(found.scope, projects, found.id)
    return None
