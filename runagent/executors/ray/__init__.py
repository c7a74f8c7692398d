"""The Ray executor: task loops on the hosts of a Ray cluster, one long-lived agent per host.

Imported only when `executor.type` is `ray` (control.ray_executor), so nothing else pays for
Ray. Each task holds a named, detached placement group of what one loop takes of a host
(`executor.resources`, `agent_slot: 1` by default). Its name, the task's label, is the
cluster-wide lock: a second start anywhere is refused, naming the host that holds the task. Ray
places the group on a host with the slot free, or keeps it in Ray's queue while none has one; a
waiting group costs no process anywhere. On each host one detached actor, the host agent
(`host:<node id>`), starts and watches the supervisors of the groups placed there: today's
detached supervisor (localexecutor.start_local), which runs the loop unchanged. So a task costs
its supervisor, as locally, and no Ray worker of its own.

What a loop was started with (a LoopSpec) is kept in the cluster's key-value store beside its
group, so the host agent of a host the group is placed on later finds it: a group that waited
in Ray's queue, or one Ray moved there because its host died (the new supervisor marks the
interrupted run `lost` and goes on with the next attempt, at most `executor.max_restarts`
times). A loop's end (its exit code) is put there too, for the one that follows it. The groups
and the store live in the cluster's GCS: with GCS fault tolerance (an external Redis) they
outlive a head that dies, and the loops on the other hosts go on.

Measured on Ray 2.60 (RESEARCH.md, Q1), and why stop goes the way it does: `ray.kill` leaves
`setsid` children alive, so a stop asks the host agent, which signals the supervisor; the
supervisor's reaper kills the agent's whole tree. The supervisors die with their host agent's
worker (PR_SET_PDEATHSIG), so a host agent that is killed leaves no agent running; Ray starts it
again on its host, and it takes its groups up again as a moved loop.

One module per concern: `driver` (the starter's side: RayExecutor, connect), `hostagent` (the
actor on each host), `mirror` (a task's folder sent to the server's root from a host that does
not share it), `store` (the cluster's key-value store and tables), `broker` (the process that
carries a runs root's commands' calls to the cluster: executors/broker.py says why), and
`boundary`, the one place Ray's exceptions are told apart and become run-agent's errors.
"""

from runagent.executors.ray.driver import RayExecutor, connect, disconnect
from runagent.executors.ray.hostagent import HostAgent, worker_root
from runagent.executors.ray.store import LoopSpec  # specs kept by a cluster name it here too
from runagent.executors.where import Where

__all__ = ["HostAgent", "LoopSpec", "RayExecutor", "Where", "connect", "disconnect", "worker_root"]
