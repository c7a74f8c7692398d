"""What the cluster keeps for run-agent, in its GCS: what a loop was started with (its LoopSpec)
and how it ended, in Ray's key-value store under the task's label, beside the task's placement
group in Ray's tables; and the hosts, with what each has free. It outlives the process that
wrote it, and with GCS fault tolerance (an external Redis) a head that dies. Ray's failures
here leave as boundary.ClusterError."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

import ray
from ray._private import state as ray_state  # the cluster's tables: groups, free resources
from ray._raylet import PlacementGroupID
from ray.experimental import internal_kv
from ray.util.placement_group import (
    NODE_ID_LABEL_KEY,
    PlacementGroup,
    placement_group,
    remove_placement_group,
)

from runagent.config.overrides import LoopOverrides
from runagent.executors.ray.boundary import mapped
from runagent.record import record

SPECS, ENDS = "spec/", "end/"  # the cluster's key-value store: a loop's spec, its end
# An agent paused by its provider's limit, and when a person last lifted its pause (pauses.py).
PAUSES, LIFTS = "pause/", "lifted/"
WAITING_STATES = ("PENDING", "PREPARED", "RESCHEDULING")  # a group not (or no longer) placed
# Where the head keeps its state, as it records it on starting (Ray's usage tags, kept whether
# or not usage stats are reported).
GCS_STORAGE_KEY, USAGE_NAMESPACE = "extra_usage_tag_gcs_storage", "usage_stats"

# The cluster's hosts and what each has free now (Ray leaves these untyped).
_hosts: Callable[[], list[dict[str, Any]]] = ray.nodes
_free_per_host: Callable[[], dict[str, dict[str, float]]] = ray_state.available_resources_per_node
# The cluster's placement groups: all of them (by id) or one (by id), and one by name.
_group_table: Callable[..., dict[str, Any]] = ray_state.state.placement_group_table
_group_by_name: Callable[[str, str], dict[str, Any] | None] = (
    ray_state.state.get_placement_group_by_name
)


@record
class LoopSpec:
    """What a host agent needs to start a task's loop on its host."""

    project_id: str
    task_id: str
    root: Path  # the starter's runs root (the host's own, when it is shared)
    shared_root: bool
    command: str
    overrides: LoopOverrides
    config_path: Path | None
    cwd: Path
    schedule: str | None
    again: bool
    prompt: str | None  # TASK.md, carried to a host that does not share the root
    wait: float
    submitted: float  # when the starter made it (time.time(); a follower knows its end by it)
    max_moves: int  # executor.max_restarts
    node: str = ""  # the host whose agent started it last ("": not started yet)
    moves: int = 0  # times it was started again after its host (or host agent) died
    group: str = ""  # its placement group's id, once the group is made
    # When its start was queued before it came to the cluster (the keeper's queue), if it was.
    queued_since: str = ""
    # When its loop last replaced its group (slot.give_back, a pause): a start that finds no
    # group meanwhile takes the spec for one still in use, not one left behind.
    touched: float = 0.0
    # What its group held of its host before its loop gave it back while its agent was paused
    # (slot.give_back); a loop started again meanwhile takes that again before it runs.
    held: Mapping[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.project_id}/{self.task_id}"


# The key-value store ---------------------------------------------------------------------------


def put_spec(namespace: str, spec: LoopSpec, overwrite: bool = True) -> bool:
    """Keep `spec` under its task's label; whether one was there already (which, without
    `overwrite`, stays)."""
    return _kv_put(namespace, SPECS + spec.label, pickle.dumps(spec), overwrite)


def spec(namespace: str, label: str) -> LoopSpec | None:
    """The spec kept for the task, if one is (and is one this version of run-agent made)."""
    data = _kv_get(namespace, SPECS + label)
    try:
        found = pickle.loads(data) if data else None
    except Exception:  # a spec of another version of run-agent: not one to start
        return None
    return found if isinstance(found, LoopSpec) else None


def drop_spec(namespace: str, label: str) -> None:
    _kv_del(namespace, SPECS + label)


def put_end(namespace: str, label: str, end: Mapping[str, Any]) -> None:
    """Keep how the task's loop ended (its exit code, its start's `submitted`, its host)."""
    _kv_put(namespace, ENDS + label, json.dumps(end).encode())


def end(namespace: str, label: str) -> dict[str, Any] | None:
    """How the task's loop last ended, as `put_end` kept it; None if unknown or unreadable."""
    data = _kv_get(namespace, ENDS + label)
    try:
        found = json.loads(data) if data else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def put_pause(namespace: str, agent: str, pause: Mapping[str, Any]) -> None:
    """Keep an agent's pause (as its record under `.fleet/paused/` has it)."""
    _kv_put(namespace, PAUSES + agent, json.dumps(pause).encode())


def drop_pause(namespace: str, agent: str) -> None:
    _kv_del(namespace, PAUSES + agent)


def pauses(namespace: str) -> list[dict[str, Any]]:
    """Every pause kept (lifted by its time or not); unreadable ones left out."""
    return [found for key in _kv_keys(namespace, PAUSES) if (found := _json(namespace, key))]


def put_lift(namespace: str, agent: str, at: float) -> None:
    """Keep when a person lifted the agent's pause (time.time()): every pause of it found
    before then is lifted on every host."""
    _kv_put(namespace, LIFTS + agent, json.dumps({"agent": agent, "at": at}).encode())


def lifts(namespace: str) -> dict[str, float]:
    """When each agent's pause was last lifted by a person, by agent."""
    found = (_json(namespace, key) for key in _kv_keys(namespace, LIFTS))
    return {str(f["agent"]): float(f["at"]) for f in found
            if f and isinstance(f.get("at"), int | float)}  # fmt: skip


def _json(namespace: str, key: str) -> dict[str, Any] | None:
    data = _kv_get(namespace, key)
    try:
        found = json.loads(data) if data else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


@mapped()
def _kv_keys(namespace: str, prefix: str) -> list[str]:
    keys = internal_kv._internal_kv_list(prefix, namespace=_kv(namespace))
    return [key.decode() if isinstance(key, bytes) else str(key) for key in keys]


@mapped()
def _kv_put(namespace: str, key: str, value: bytes, overwrite: bool = True) -> bool:
    return bool(internal_kv._internal_kv_put(key, value, overwrite, namespace=_kv(namespace)))


@mapped()
def _kv_get(namespace: str, key: str) -> bytes | None:
    found = internal_kv._internal_kv_get(key, namespace=_kv(namespace))
    return found if isinstance(found, bytes) else None


@mapped()
def _kv_del(namespace: str, key: str) -> None:
    internal_kv._internal_kv_del(key, namespace=_kv(namespace))


def _kv(namespace: str) -> str:
    return f"run-agent/{namespace}"


@mapped()
def state_kept() -> str:
    """Where the cluster's head keeps its state: `redis` (GCS fault tolerance), `memory`, or ''
    if it does not say (what the head recorded as it started)."""
    found = internal_kv._internal_kv_get(GCS_STORAGE_KEY, namespace=USAGE_NAMESPACE)
    return found.decode() if isinstance(found, bytes) else ""


# The placement groups: a task's is named by its label ------------------------------------------


@mapped()
def make_group(label: str, bundle: Mapping[str, float], *, near: str = "", only: str = "") -> Any:
    """The task's placement group of one `bundle` on one host, made detached (it outlives its
    maker) and named by the label, which makes the name the cluster-wide lock: NameTakenError
    if the task has one already. `near`: on that node where it has room (else anywhere);
    `only`: on that node, waiting in Ray's queue until it has room."""
    return placement_group(
        [dict(bundle)], strategy="STRICT_PACK", name=label, lifetime="detached",
        _soft_target_node_id=near or None,
        bundle_label_selector=[{NODE_ID_LABEL_KEY: only}] if only else None,
    )  # fmt: skip


def group_bundle(group: Mapping[str, Any]) -> dict[str, float]:
    """What the group holds of its host (its one bundle)."""
    bundles = list((group.get("bundles") or {}).values())
    return {str(k): float(v) for k, v in (bundles[0] if bundles else {}).items()}


@mapped()
def group(label: str, namespace: str) -> dict[str, Any] | None:
    """The task's placement group in the cluster's table, or None."""
    found = _group_by_name(label, namespace)
    return found if isinstance(found, dict) and found.get("state") != "REMOVED" else None


@mapped()
def group_by_name(label: str, namespace: str) -> dict[str, Any] | None:
    """The group named `label` in `namespace` as the table has it (a removed one too)."""
    found = _group_by_name(label, namespace)
    return found if isinstance(found, dict) else None


@mapped()
def groups() -> list[dict[str, Any]]:
    """Every placement group of the cluster, of every namespace."""
    return list(_group_table().values())


@mapped()
def group_by_id(group_id: str) -> dict[str, Any]:
    """The group `group_id` (hex) as the table has it ({} if it has none); ValueError for an
    id that is not one."""
    return _group_table(PlacementGroupID.from_hex(group_id))


def group_node(group: Mapping[str, Any]) -> str:
    """The node id of the host the group is placed on ('' while it waits)."""
    nodes = list((group.get("bundles_to_node_id") or {}).values())
    return str(nodes[0]) if nodes else ""


@mapped()
def remove_group(label: str, namespace: str, group_id: str | None = None) -> None:
    """Remove the task's group (only if it is `group_id`, when given)."""
    found = group(label, namespace)
    if found is None or (group_id is not None and found["placement_group_id"] != group_id):
        return
    remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(found["placement_group_id"])))


# The hosts ------------------------------------------------------------------------------------


@mapped()
def hosts() -> list[dict[str, Any]]:
    """The cluster's hosts, live or not (Ray leaves them untyped)."""
    return _hosts()


@mapped()
def free_per_host() -> dict[str, dict[str, float]]:
    """What each host has free now, by node id."""
    return _free_per_host()


def fits(room: Mapping[str, float], needs: Mapping[str, float]) -> bool:
    return all(room.get(name, 0) >= amount for name, amount in needs.items())
