from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Workspace
from tests.loop.sandboxing import home_with_key


@pytest.fixture
def home(ws_outside: Workspace) -> Iterator[Path]:
    """A home beside the workspace (not in it) with a private key in ~/.ssh."""
    yield from home_with_key(ws_outside.path)
