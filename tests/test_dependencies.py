"""The development install gives the test tools what they are built on, so they warn of nothing."""

from __future__ import annotations

import subprocess
import sys


def test_starlettes_test_client_imports_without_a_deprecation_warning() -> None:
    # In a fresh interpreter: this one may have imported the module (and warned) already.
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import starlette.testclient"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.strip().splitlines()[-1:]
