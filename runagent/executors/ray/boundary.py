"""Where Ray's failures become run-agent's, once, as httpx maps its transport's errors in one
place. A call into Ray whose failure run-agent judges goes through `call`, `actor`, `join`, or
runs inside `mapped()`; the other modules of the package catch the classes below, never one of
Ray's (tests/executors/test_ray_boundary.py fails on a Ray exception named anywhere else).

What a method of one of run-agent's actors raised on purpose (a RunAgentError: a loop that
would not stop, say) comes back as itself, as if it had been raised here; what Ray failed it in
(a ClusterError there) comes back as a RemoteError, never taken for this side's own call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.exceptions import (
    ActorAlreadyExistsError,
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayError,
    RayTaskError,
)

from runagent.errors import RunAgentError


class ClusterError(RunAgentError):
    """Ray failed a call: the cluster's doing, not the task's (Ray's own first line)."""


class NoAnswerError(ClusterError):
    """An actor cannot answer now (busy, or being started again on its host); not gone."""


class TimedOutError(NoAnswerError):
    """No answer within the time the call was given."""


class RestartingError(NoAnswerError):
    """The actor is being started again on its host (it takes calls again soon)."""


class GoneError(ClusterError):
    """The actor died for good, or no actor has the name asked for."""


class NameTakenError(ClusterError):
    """A named actor or placement group of that name exists already."""


class RemoteError(ClusterError):
    """A method of an actor raised something other than a RunAgentError (named in the
    message)."""


class NoClusterError(ClusterError):
    """No Ray cluster answers at the address (`join`)."""


@contextmanager
def mapped() -> Iterator[None]:
    """Ray's exceptions raised inside the block (or the function it decorates), as run-agent's:
    the one place they are told apart."""
    try:
        yield
    except GetTimeoutError as exc:
        raise TimedOutError(first_line(exc)) from exc
    except ActorUnavailableError as exc:  # a RayActorError too: judged before it
        raise RestartingError(first_line(exc)) from exc
    except RayActorError as exc:
        raise GoneError(first_line(exc)) from exc
    except ActorAlreadyExistsError as exc:
        raise NameTakenError(first_line(exc)) from None
    except RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, RunAgentError) and not isinstance(cause, ClusterError):
            raise cause from None  # the actor's own refusal, raised on purpose
        said = f"{type(cause).__name__}: {first_line(cause)}" if cause is not None else ""
        raise RemoteError(said or first_line(exc)) from exc
    except RayError as exc:
        if "already exists" in str(exc):  # a placement group's name: Ray has no class for it
            raise NameTakenError(first_line(exc)) from None
        raise ClusterError(first_line(exc)) from exc


def call(method: Any, *args: Any, timeout: float | None = None) -> Any:
    """What the actor's method `method` (`handle.name`) returns for `args`, waited for up to
    `timeout` seconds (None: as long as it takes)."""
    with mapped():
        return ray.get(method.remote(*args), timeout=timeout)


def actor(name: str, namespace: str) -> Any:
    """The handle of the actor named `name` in `namespace`; GoneError if there is none."""
    try:
        with mapped():
            return ray.get_actor(name, namespace=namespace)
    except ValueError:  # how Ray says that no actor has the name
        raise GoneError(f"no actor {name!r} in namespace {namespace!r}") from None


def join(address: str, namespace: str) -> None:
    """Join the cluster at `address` as a driver; NoClusterError if none answers there."""
    try:
        ray.init(
            address=address, namespace=namespace, logging_level=logging.ERROR, log_to_driver=False
        )
    except ConnectionError as exc:  # how Ray says that no cluster is there
        raise NoClusterError(first_line(exc)) from None


def placed(group: Any, timeout: float) -> bool | None:
    """Whether the placement group `group` was placed within `timeout` seconds; None if it went
    meanwhile (removed, or made again under its name: hostagent's hand-over of a freed slot)."""
    try:
        with mapped():
            return bool(group.wait(timeout))
    except ClusterError:
        return None
    except Exception as exc:  # how Ray's wait says the group is no more: a bare Exception
        said = str(exc)
        if "does not exist" in said or "removed" in said:
            return None
        raise ClusterError(first_line(exc)) from exc


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
