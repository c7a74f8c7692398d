"""An agent paused by its provider's limit, on a cluster whose hosts keep runs roots of their own
(executor.shared_root false): the pause a loop writes under its host's root (`.fleet/paused/`)
is kept in the cluster's store as well (store.py), and every root that takes part brings the
cluster's pauses in, so the one found on any host holds for every start and every loop of the
cluster. Each host agent does so for its host's root (hostagent.HostAgent._watch), the door
for the starter's root as it starts, lists the fleet or lifts a pause.

A person's `fleet unpause` is kept too, as when it was: a pause found before it is lifted
wherever it is met (a host that took it in before the unpause drops it as it next looks), so
no root can bring back a pause lifted elsewhere. A pause found on a host after the unpause
holds again, as it should."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import runagent.executors.ray.store as store
from runagent.fleet.queue import Fleet, Pause


def sync(root: Path, namespace: str) -> None:
    """Make `root`'s pauses and the cluster's one: a pause found under `root` that the cluster
    does not have (or has until an earlier time) goes to it, one the cluster has comes here,
    and one lifted by a person anywhere is lifted here."""
    fleet = Fleet(root)
    kept = {p.agent: p for p in _cluster_pauses(namespace)}
    lifts = store.lifts(namespace)  # read after the pauses: an unpause keeps its lift first
    if not kept and not fleet.paused.is_dir():
        return
    with fleet.locked():
        for agent, pause in fleet.pauses().items():
            if _lifted_by(pause, lifts.get(agent)):
                fleet.unpause(agent)
                continue
            held = kept.get(agent)
            if held is None or held.until < pause.until:
                store.put_pause(namespace, agent, pause.to_json())
                kept[agent] = pause
        for agent, pause in kept.items():
            if pause.lifted() or _lifted_by(pause, lifts.get(agent)):
                store.drop_pause(namespace, agent)
            else:
                fleet.pause(pause)  # kept as it is where this root has a later one


def unpause(namespace: str, agent: str) -> Pause | None:
    """Lift `agent`'s pause on every host: the lift kept first (so no root brings the pause
    back meanwhile), then the pause. The pause the cluster had, if one holds."""
    held = next((p for p in _cluster_pauses(namespace) if p.agent == agent), None)
    store.put_lift(namespace, agent, time.time())
    store.drop_pause(namespace, agent)
    return held if held is not None and not held.lifted() else None


def _cluster_pauses(namespace: str) -> list[Pause]:
    found = []
    for data in store.pauses(namespace):
        try:
            found.append(Pause.from_json(data))
        except (ValueError, KeyError, TypeError):  # not one run-agent wrote: it holds nothing
            continue
    return found


def _lifted_by(pause: Pause, lifted_at: float | None) -> bool:
    """Whether a person lifted the pause: it was found before their last unpause of its agent
    (one whose time of finding cannot be read counts as found before)."""
    if lifted_at is None:
        return False
    try:
        found = datetime.fromisoformat(pause.since).timestamp()
    except ValueError:
        return True
    return found <= lifted_at
