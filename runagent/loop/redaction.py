"""The Redactor: the credentials an agent's runs may hold, blanked out of text run-agent copies."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from runagent.record import record
from runagent.store.credentials import is_credential_name, scrub_urls

REDACTED = "[REDACTED]"
# Shorter values are not redacted: blanking every "true" or "1234" would garble the text, and no
# real key is that short.
MIN_LENGTH = 6
__all__ = ["REDACTED", "Redactor", "is_credential_name"]


@record
class Redactor:
    """Replaces every occurrence of each secret by REDACTED, and every URL's password by `***`
    (credentials.scrub_urls); build it with `of`."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, values: Iterable[str | None]) -> Redactor:
        unique = {v.strip() for v in values if v and len(v.strip()) >= MIN_LENGTH}
        # Longest first, so a secret that contains another is blanked whole.
        return cls(tuple(sorted(unique, key=lambda s: (-len(s), s))))

    @classmethod
    def of_environment(cls, env: Mapping[str, str], extra: Iterable[str | None] = ()) -> Redactor:
        """The values of `env`'s credential variables, plus `extra`."""
        return cls.of([*(v for k, v in env.items() if is_credential_name(k)), *extra])

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return scrub_urls(text)

    def data(self, value: Any) -> Any:
        """`value` (JSON-like: dicts, lists, strings) with every string redacted."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value
