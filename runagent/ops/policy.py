"""Placeholder for the policy gate: the interface the runtime codes against, and three tiny presets.

This is not the policy engine: the bash-grammar engine replaces this module, keeping exactly
this interface (`Verdict`, `Decision`, `Policy.preset`, `check_command`, `check_path`). Until
then nothing is denied; a command is held for approval when its first word is one of a small
set (and, under `restrictive`, every command and every delete is).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from runagent.errors import UsageError


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    APPROVE = "approve"
    DENY = "deny"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    rule: str
    reason: str
    suggestion: str | None = None


_ASK_FIRST = frozenset({"rm", "rmdir", "sudo", "dd", "mkfs", "chmod", "chown", "kill", "git"})
_ALLOW = Decision(Verdict.ALLOW, "placeholder.allow", "allowed")


@dataclass(frozen=True)
class Policy:
    name: str
    ask_first_words: frozenset[str] = frozenset()
    ask_every_command: bool = False
    ask_deletes: bool = False

    @classmethod
    def preset(cls, name: str) -> Policy:
        if name == "restrictive":
            return cls(name, _ASK_FIRST, ask_every_command=True, ask_deletes=True)
        if name == "standard":
            return cls(name, _ASK_FIRST)
        if name == "permissive":
            return cls(name)
        raise UsageError(f"policy {name!r} is not known; use restrictive, standard or permissive")

    def check_command(self, command: str) -> Decision:
        words = command.split()
        first = words[0] if words else ""
        if self.ask_every_command or first in self.ask_first_words:
            return Decision(
                Verdict.APPROVE,
                f"{self.name}.shell.approvalRequired",
                f"the {self.name} policy asks before running {first or 'an empty command'!r}",
            )
        return _ALLOW

    def check_path(self, operation: str, path: str) -> Decision:
        if self.ask_deletes and operation == "deleteFile":
            return Decision(
                Verdict.APPROVE,
                f"{self.name}.files.deleteApproval",
                f"the {self.name} policy asks before deleting {path}",
            )
        return _ALLOW
