"""The operations runtime: JSON operations from a model, run in a confined workspace under a policy,
answered with events (spec/operations-protocol.md).

Its modules are imported by name (`runagent.ops.runtime`, `.workspace`, `.policy`, ...): nothing is
imported here, so a command that does not use operations does not pay for them at start-up.
"""
