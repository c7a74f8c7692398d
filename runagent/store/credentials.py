"""What a credential looks like, and keeping credentials out of what run-agent hands on, writes
or prints: a run-agent token, a variable that holds a secret, a URL's password. A loop's command
line imports this, not the token store.

- `scrub`: an environment without run-agent's own credentials (what a loop is started with).
- `withhold`: an environment as a record on disk may keep it (a queued start): the values of the
  variables that hold no secret, the names alone of those that do.
- `scrub_urls`: text with every URL's credentials replaced by `***`: each error line, git's
  words, a record, a prompt that quotes a URL goes through it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

TOKEN = re.compile(r"rat_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")  # rat_<id>_<secret>
HIDDEN = "***"
_CREDENTIAL_NAME = re.compile(
    r"(?:^|_)(?:API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE
)
# scheme://userinfo@ : the userinfo runs to the last '@' before the path ('/', '?', '#'), so a
# password with an unescaped '@' in it is taken whole.
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://([^\s/?#@'\"<>]*(?:@[^\s/?#@'\"<>]*)*)@")
# Schemes whose lone user name is how a token is often passed (https://TOKEN@host/repo).
_TOKEN_AS_USER = frozenset({"http", "https"})


def scrub(env: Mapping[str, str], key_variable: str) -> dict[str, str]:
    """`env` without the server's API key (`key_variable`) and any token: an agent, a queued
    start's record and a detached supervisor never hold a credential of run-agent itself (an
    agent told to could hand it on)."""
    return {k: v for k, v in env.items() if k != key_variable and not TOKEN.search(v)}


def is_credential_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential (…_API_KEY, …_TOKEN)."""
    return bool(_CREDENTIAL_NAME.search(name))


def holds_secret(name: str, value: str, named: Collection[str] = ()) -> bool:
    """Whether the variable `name`=`value` holds a secret: its name says so (or is one of
    `named`, the variables a config names as holding one), or its value is a URL with
    credentials in it."""
    return bool(value) and (name in named or is_credential_name(name) or scrub_urls(value) != value)


def withhold(
    env: Mapping[str, str], named: Collection[str] = ()
) -> tuple[dict[str, str], tuple[str, ...]]:
    """`env` as a record on disk keeps it: the variables that hold no secret with their values,
    and the names alone of those that do (holds_secret), in order; whoever acts on the record
    takes their values from its own environment (`restore`)."""
    values = {k: v for k, v in env.items() if not holds_secret(k, v, named)}
    return values, tuple(sorted(k for k in env if k not in values))


def restore(
    values: Mapping[str, str], withheld: Collection[str], env: Mapping[str, str]
) -> tuple[dict[str, str], tuple[str, ...]]:
    """The environment a record's `values` and `withheld` names stand for, each withheld one's
    value taken from `env`; and the withheld names `env` does not set, in order."""
    missing = tuple(sorted(name for name in withheld if name not in env))
    return {**values, **{n: env[n] for n in withheld if n in env}}, missing


def scrub_urls(text: str) -> str:
    """`text` with each URL's password replaced by `***` (`https://user:***@host/x`), and a
    lone user name too in an http(s) URL, where a token is often passed as one."""
    return _URL_USERINFO.sub(_hidden, text) if "://" in text else text


def _hidden(found: re.Match[str]) -> str:
    scheme, userinfo = found.group(1), found.group(2)
    user, colon, _ = userinfo.partition(":")
    if colon:
        return f"{scheme}://{user}:{HIDDEN}@"
    if scheme.lower() in _TOKEN_AS_USER and userinfo:
        return f"{scheme}://{HIDDEN}@"
    return found.group(0)
