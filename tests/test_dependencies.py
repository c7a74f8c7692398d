"""The development install gives the test tools what they are built on, so they warn of nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def test_starlettes_test_client_imports_without_a_deprecation_warning() -> None:
    # In a fresh interpreter: this one may have imported the module (and warned) already.
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import starlette.testclient"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.strip().splitlines()[-1:]


def test_no_tracked_link_leads_out_of_the_clone() -> None:
    """A link committed with an absolute target (a helper's `.cache` once) means nothing in a
    clean clone, and one into the caches hides what the CI installs there."""
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.splitlines()  # fmt: skip
    links = [line.split("\t", 1)[1] for line in listed if line.startswith("120000 ")]
    for link in links:
        target = os.readlink(REPO / link)
        assert not os.path.isabs(target), f"{link} links to {target}"
        assert (REPO / link).resolve().is_relative_to(REPO.resolve()), f"{link} leads out"
    assert ".cache" not in {link.split("/")[0] for link in links}
