"""The operations runtime: validation, the workspace sandbox, the policy and the executor."""
