"""Issue runs: issues, cocode, repositories, worktrees and their pruning."""
