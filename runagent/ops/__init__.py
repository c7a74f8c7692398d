"""The operations runtime: JSON operations from a model, run in a confined workspace under a policy,
answered with events (spec/operations-protocol.md).

Its modules are imported by name (`runagent.ops.runtime`, `.workspace`, `.policy`, ...): nothing is
imported here, so a command that does not use operations does not pay for them at start-up. What
is here is what the config names of them (config.settings' `ops:` and `approvals:`).
"""

import enum


class Approvals(enum.StrEnum):
    """What an unattended agent-mode run does with an operation that needs a person's approval."""

    WAIT = "wait"  # pause until `run-agent ops approve|deny RUN OP` answers
    DENY = "deny"  # deny it at once, and tell the model why
