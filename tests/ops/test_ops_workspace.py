"""The workspace sandbox: file operations confined to the root, through links and races."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from runagent.ops.workspace import OutsideWorkspaceError, Workspace, WorkspaceError


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "ws"


def once(action: Callable[[], None]) -> Callable[[], None]:
    """A hook that acts the first time it is called only."""
    done: list[bool] = []

    def hook() -> None:
        if not done:
            done.append(True)
            action()

    return hook


def test_write_makes_parents_and_writes_atomically(root: Path) -> None:
    ws = Workspace(root)
    assert ws.write("a/b/c.txt", "héllo".encode(), overwrite=False) == 6
    assert (root / "a/b/c.txt").read_text() == "héllo"
    assert os.listdir(root / "a/b") == ["c.txt"]  # no temporary file left behind
    assert ws.read("a/b/c.txt") == "héllo".encode()


def test_overwrite_is_honoured_and_keeps_the_mode(root: Path) -> None:
    ws = Workspace(root)
    ws.write("run.sh", b"one", overwrite=False)
    (root / "run.sh").chmod(0o750)
    with pytest.raises(WorkspaceError, match="File already exists"):
        ws.write("run.sh", b"two", overwrite=False)
    assert (root / "run.sh").read_bytes() == b"one"
    ws.write("run.sh", b"two", overwrite=True)
    assert (root / "run.sh").read_bytes() == b"two"
    assert stat.S_IMODE((root / "run.sh").stat().st_mode) == 0o750


def test_a_folder_is_not_a_file(root: Path) -> None:
    (root / "d").mkdir()
    ws = Workspace(root)
    for action in (lambda: ws.read("d"), lambda: ws.write("d", b"", overwrite=True),
                   lambda: ws.delete("d")):  # fmt: skip
        with pytest.raises(WorkspaceError, match="folder"):
            action()
    assert (root / "d").is_dir()


def test_missing_files(root: Path) -> None:
    ws = Workspace(root)
    with pytest.raises(WorkspaceError, match="File not found"):
        ws.read("nope.txt")
    with pytest.raises(WorkspaceError, match="File not found"):
        ws.delete("nope.txt")
    with pytest.raises(WorkspaceError, match="not found"):
        ws.read("no/such/folder.txt")


def test_a_fifo_is_refused_without_hanging(root: Path) -> None:
    os.mkfifo(root / "pipe")
    with pytest.raises(WorkspaceError, match="not a regular file"):
        Workspace(root).read("pipe")


def test_delete_removes_files_only(root: Path) -> None:
    (root / "f").write_text("x")
    Workspace(root).delete("f")
    assert not (root / "f").exists()


@pytest.mark.parametrize(
    "path",
    ["../outside.txt", "/etc/passwd", "a/../../outside.txt", "..", "a\0b", "x" * 256],
)
def test_paths_the_protocol_refuses_are_refused_here_too(root: Path, path: str) -> None:
    ws = Workspace(root)
    with pytest.raises(WorkspaceError):
        ws.read(path)
    with pytest.raises(WorkspaceError):
        ws.write(path, b"x", overwrite=True)
    assert (root.parent / "outside.txt").read_text() == "secret"


def test_a_link_to_the_root_of_the_machine_is_refused(root: Path) -> None:
    (root / "slash").symlink_to("/")
    ws = Workspace(root)
    with pytest.raises(OutsideWorkspaceError):
        ws.read("slash/etc/passwd")
    with pytest.raises(OutsideWorkspaceError):
        ws.write("slash/tmp/planted", b"x", overwrite=False)
    with pytest.raises(OutsideWorkspaceError):
        ws.folder("slash")


def test_a_link_to_a_file_outside_is_refused(root: Path) -> None:
    outside = root.parent / "outside.txt"
    (root / "secret").symlink_to(outside)
    (root / "up").symlink_to("..")
    ws = Workspace(root)
    for path in ("secret", "up/outside.txt"):
        with pytest.raises(OutsideWorkspaceError):
            ws.read(path)
        with pytest.raises(OutsideWorkspaceError):
            ws.write(path, b"pwned", overwrite=True)
    with pytest.raises(OutsideWorkspaceError):
        ws.delete("secret")
    assert outside.read_text() == "secret" and (root / "secret").is_symlink()


def test_links_that_stay_inside_are_followed(root: Path) -> None:
    (root / "sub").mkdir()
    (root / "alias").symlink_to("sub")
    (root / "absolute").symlink_to(root / "sub")
    (root / "sub" / "up-and-back").symlink_to("../sub/f.txt")
    ws = Workspace(root)
    ws.write("alias/f.txt", b"1", overwrite=False)
    assert (root / "sub/f.txt").read_bytes() == b"1"
    assert ws.read("absolute/f.txt") == b"1"
    assert ws.read("sub/up-and-back") == b"1"
    ws.write("sub/up-and-back", b"2", overwrite=True)  # writes the file the link names
    assert (root / "sub/f.txt").read_bytes() == b"2" and (root / "sub/up-and-back").is_symlink()
    ws.delete("sub/up-and-back")  # the link goes, not its target
    assert (root / "sub/f.txt").exists() and not os.path.lexists(root / "sub/up-and-back")


def test_a_link_loop_ends(root: Path) -> None:
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    with pytest.raises(WorkspaceError, match="too many levels"):
        Workspace(root).read("a")


def test_a_cwd_outside_is_refused(root: Path) -> None:
    (root / "out").symlink_to(root.parent / "elsewhere")
    (root / "in").mkdir()
    ws = Workspace(root)
    with pytest.raises(OutsideWorkspaceError):
        ws.folder("out")
    with pytest.raises(OutsideWorkspaceError):
        ws.folder("../elsewhere")
    assert ws.folder("in") == root.resolve() / "in"
    assert ws.folder("") == root.resolve()


def test_a_link_swapped_in_for_the_file_after_the_check_is_not_followed(root: Path) -> None:
    (root / "a.txt").write_text("mine")

    def swap() -> None:
        (root / "a.txt").unlink()
        (root / "a.txt").symlink_to(root.parent / "outside.txt")

    with pytest.raises(OutsideWorkspaceError):
        Workspace(root, on_located=once(swap)).read("a.txt")


def test_a_link_swapped_in_for_a_folder_after_the_check_cannot_redirect_a_write(
    root: Path,
) -> None:
    (root / "sub").mkdir()

    def swap() -> None:
        (root / "sub").rename(root / "moved")
        (root / "sub").symlink_to(root.parent / "elsewhere")

    Workspace(root, on_located=once(swap)).write("sub/f.txt", b"x", overwrite=False)
    assert os.listdir(root.parent / "elsewhere") == []
    assert (root / "moved" / "f.txt").read_bytes() == b"x"


def test_a_link_swapped_in_for_the_target_of_an_overwrite_is_replaced_not_followed(
    root: Path,
) -> None:
    (root / "f.txt").write_text("old")

    def swap() -> None:
        (root / "f.txt").unlink()
        (root / "f.txt").symlink_to(root.parent / "outside.txt")

    Workspace(root, on_located=once(swap)).write("f.txt", b"new", overwrite=True)
    assert (root.parent / "outside.txt").read_text() == "secret"
    assert (root / "f.txt").read_bytes() == b"new" and not (root / "f.txt").is_symlink()


def test_a_workspace_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    from runagent.errors import UsageError

    with pytest.raises(UsageError, match="does not exist"):
        Workspace(tmp_path / "nope")
