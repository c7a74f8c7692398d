"""The fleet: the layer above one task's loop. A cap on how many loops run at once, with a queue
that keeps the order (queue.py); tasks that wait for others to complete first (depends.py); and
the view of it all at once (overview.py). The keeper, the one process per runs root that starts
queued detached tasks as slots free, starts them on their executor (executors/keeper.py). All of
it lives in files under the runs root, so it holds across the command line, `serve` and
cron-fired runs at once, with no daemon to keep alive.
"""
