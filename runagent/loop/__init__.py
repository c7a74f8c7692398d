"""The Ralph loop: supervisor, one attempt, completion and failure, prompt, events, notifications,
redaction, processes and the reaper, and the backend interface."""
