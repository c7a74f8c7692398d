"""Where a task's loop runs: a detached local supervisor, or an actor on Ray."""
