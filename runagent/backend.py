"""The public interface a backend imports (`from runagent.backend import ...`): everything
runagent/loop/backend.py names in its `__all__`, kept at this one stable place for backends
outside this repository (tests/backends/test_backend_interface.py holds it to that)."""

from runagent.loop.backend import *  # noqa: F403  (the names are loop.backend's __all__)
from runagent.loop.backend import __all__ as __all__
