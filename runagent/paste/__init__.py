"""The copy-paste channel (spec/copy-paste-protocol.md): an agent run through any chat window.

run-agent writes an outbox holding everything the model needs, a person pastes it into a chat and
saves the reply into the inbox, and the reply's `[COMMAND]` blocks are carried out through the
operations runtime (one workspace sandbox, one shell policy). Nothing is imported here, so a run
that does not use the channel loads none of it.
"""
