"""What lies on disk under a runs root: run and task folders, run-info, locks, hosts, following a
task's files, cleanup and spend."""
