"""A loop's agent_slot given back to the cluster while its agent is paused by a provider's limit,
and taken again on its host when the pause lifts (the fleet's gate waits the pause out between
the two: service.FleetPause).

A task's placement group holds its slot and, by its name (the task's label), the cluster-wide
lock, and Ray cannot shrink a group. So giving the slot back replaces the group by one of the
same name on the same host that holds a byte of memory only (the name, the lock and where the
loop runs are kept), and taking it again adds a second group, `LABEL#slot`, of what the first
held, placed on that host only: it waits in Ray's queue, behind the starts queued before it,
until that host has the slot free. A later pause removes that one again; the loop's end removes
both (hostagent.HostAgent._finish). The loop learns its cluster from its host agent
(CLUSTER_ENV), and joins it only when its agent is paused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import field, replace
from typing import Any

import ray

import runagent.executors.ray.store as store
from runagent.executors.local import CLUSTER_ENV  # {"address", "namespace"}
from runagent.executors.ray.boundary import ClusterError, NameTakenError, join
from runagent.record import record

SLOT = "#slot"  # the name of the group that holds a loop's slot again after a pause: LABEL#slot
HOLD = {"memory": 1.0}  # what a paused loop's group holds: nothing another loop needs
LOOK = 0.25  # seconds between looks at a group waiting in Ray's queue (and at the loop's stop)
RENAME_WAIT = 10.0  # seconds a removed group's name may take to be free again


@record
class Cluster:
    """The cluster a host agent started a loop on, as it tells the loop; for a loop started
    again there (its supervisor died while its agent was paused, the slot given back), its
    host and what it is to take again of it before it runs."""

    address: str
    namespace: str
    node: str = ""
    held: Mapping[str, float] = field(default_factory=dict)

    def to_env(self) -> str:
        said: dict[str, Any] = {"address": self.address, "namespace": self.namespace}
        if self.held:
            said.update(node=self.node, held=dict(self.held))
        return json.dumps(said)

    @staticmethod
    def from_env(env: Mapping[str, str]) -> Cluster | None:
        """The cluster CLUSTER_ENV names; None for a loop that no host agent started."""
        try:
            said = json.loads(env.get(CLUSTER_ENV) or "null")
            if not said:
                return None
            held = {str(k): float(v) for k, v in (said.get("held") or {}).items()}
            return Cluster(str(said["address"]), str(said["namespace"]),
                           str(said.get("node") or ""), held)  # fmt: skip
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class Slot:
    """A loop's agent_slot on the cluster, given back and taken again around a pause."""

    def __init__(self, cluster: Cluster, label: str) -> None:
        self.cluster, self.label = cluster, label
        # The loop's host and what its group held of it, once its slot was given back (by
        # this loop, or by the one whose supervisor died while its agent was paused).
        self.node, self.bundle = cluster.node, dict(cluster.held)

    def _join(self) -> None:
        if not ray.is_initialized():
            join(self.cluster.address, self.cluster.namespace)

    def give_back(self) -> bool:
        """Free the slot the loop's group holds (the name kept); whether one was freed."""
        ns, label = self.cluster.namespace, self.label
        self._join()
        again = store.group(label + SLOT, ns)
        if again is not None:  # taken again after an earlier pause: that group goes
            self.node = store.group_node(again) or self.node
            self.bundle = store.group_bundle(again) or self.bundle
            store.remove_group(label + SLOT, ns, again["placement_group_id"])
            return True
        found = store.group(label, ns)
        if found is None or found.get("state") != "CREATED":
            return False
        bundle = store.group_bundle(found)
        if bundle == HOLD:
            return False
        self.node, self.bundle = store.group_node(found), bundle
        spec = store.spec(ns, label)
        if spec is not None:  # a start meanwhile finds no group, and must not take it for gone
            spec = replace(spec, touched=time.time())
            store.put_spec(ns, spec)
        store.remove_group(label, ns, found["placement_group_id"])
        hold = _remade(lambda: store.make_group(label, HOLD, near=self.node))
        if spec is not None:  # the host agent removes this one when the loop ends
            store.put_spec(ns, replace(spec, group=hold.id.hex(), held=bundle))
        return True

    def take_again(self, stopped: Callable[[float], bool]) -> bool:
        """Take the slot again on the loop's host, waiting in Ray's queue until it has one
        free; False if the loop was stopped meanwhile (`stopped(seconds)` waits between looks,
        and says whether it was)."""
        if not self.bundle:
            return True
        self._join()
        ns, name = self.cluster.namespace, self.label + SLOT
        group = _remade(lambda: store.make_group(name, self.bundle, only=self.node))
        wanted = group.id.hex()
        while True:
            found = store.group(name, ns)
            if found is None or found.get("placement_group_id") != wanted:
                return False  # removed by another: the loop ends as stopped
            if found.get("state") == "CREATED":
                return True
            if stopped(LOOK):
                store.remove_group(name, ns, wanted)
                return False


def _remade(make: Callable[[], Any]) -> Any:
    """A group made under a name whose group was just removed: Ray frees the name soon after."""
    deadline = time.monotonic() + RENAME_WAIT
    while True:
        try:
            return make()
        except NameTakenError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


__all__ = ["CLUSTER_ENV", "Cluster", "ClusterError", "Slot"]
