"""A Ray cluster whose head keeps its state in Redis (GCS fault tolerance), run in a process of
its own so that the test driving it is never a Ray driver itself: a head (no agent_slot) and two
hosts, hostB and hostC, with agent_slot 1 each. Commands on stdin, one per line; answers on
stdout:

    (start)   address HOST:PORT     the cluster is up
    kill   -> killed                the head's GCS server SIGKILLed (the cluster's state gone
                                    from the head; the hosts' raylets wait for it to come back)
    start  -> started               the head's GCS server started again on the same port, with
                                    the same Redis, from which it takes its state up
    (EOF)                           the cluster is shut down and this process exits

Run as `python tests/e2e/headcluster.py` with RAY_REDIS_ADDRESS set (and RAY_TMPDIR short).
"""

from __future__ import annotations

import sys

from ray.cluster_utils import Cluster

FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 10,
}


def main() -> None:
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": FAST_HEALTH}
    )
    try:
        for name in ("hostB", "hostC"):
            cluster.add_node(num_cpus=1, resources={"agent_slot": 1},
                             env_vars={"RUN_AGENT_HOST": name})  # fmt: skip
        cluster.wait_for_nodes()
        print(f"address {cluster.address}", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "kill":
                cluster.head_node.kill_gcs_server()
                print("killed", flush=True)
            elif command == "start":
                cluster.head_node.start_gcs_server()
                print("started", flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
