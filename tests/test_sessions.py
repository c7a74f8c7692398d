"""The suite runs beside other pytest sessions (a file run by hand, another checkout's suite)
and on parallel workers without one taking another's temp folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_a_new_tmp_path_is_empty(tmp_path: Path) -> None:
    assert not any(tmp_path.iterdir())


def test_another_session_ending_leaves_this_sessions_temp_folders(tmp_path: Path) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("still needed")
    other = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         f"{Path(__file__).relative_to(REPO)}::test_a_new_tmp_path_is_empty"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert other.returncode == 0, other.stdout + other.stderr
    assert mine.read_text() == "still needed"
