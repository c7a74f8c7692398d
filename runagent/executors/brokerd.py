"""The cluster broker's program (broker.py says why there is one): ray/broker.py's, which needs
Ray; without it, it exits MISSING_DEPENDENCY, and the command that started it joins the cluster
itself, which fails the same way and says why in its one line.

    RUN_AGENT_BROKER_ROOT=ROOT python -m runagent.executors.brokerd ADDRESS NAMESPACE
"""

from __future__ import annotations

import sys

from runagent.errors import ExitCode


def main() -> int:
    try:
        from runagent.executors.ray.broker import main as serve
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("ray"):
            raise
        print(f"run-agent broker: {exc}", file=sys.stderr)
        return int(ExitCode.MISSING_DEPENDENCY)
    return serve(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
