"""The workspace sandbox: every file operation on a path relative to one root folder, confined.

Each path is resolved one component at a time from a descriptor of the root, each folder opened
with O_NOFOLLOW relative to the one before (openat). A symbolic link on the way is read and
resolved the same way, so a link is followed only while it stays inside: a link to `/` or to a
file outside is refused as surely as `../`. Because every step uses the descriptor of the step
before, a link swapped in after a check cannot redirect the step that follows it: the final
open refuses links (O_NOFOLLOW) and, finding one, resolves again from the root. Writes go to a
temporary file in the same folder, renamed into place (or linked, when an existing file must not
be replaced), so a reader never sees half a file.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections import deque
from collections.abc import Callable
from pathlib import Path

from runagent.errors import RunAgentError, UsageError
from runagent.ops.operation import path_problem
from runagent.ops.protocol import MAX_FILE_BYTES

MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RETRIES = 3  # times a final link swapped in is resolved again before giving up


class WorkspaceError(RunAgentError):
    """A file operation that failed; the message is the event's `error`."""


class OutsideWorkspaceError(WorkspaceError):
    """A path that leads out of the workspace (through a link); nothing is read or written."""


class Workspace:
    """A root folder, and the confined file operations on paths inside it."""

    def __init__(self, root: Path, *, on_located: Callable[[], None] | None = None) -> None:
        # on_located runs between resolving a path and using it: the seam the tests use to swap
        # a link in at the worst moment.
        try:
            self.root = root.resolve(strict=True)
        except (OSError, RuntimeError) as exc:
            raise UsageError(f"workspace {str(root)!r} does not exist; create it first") from exc
        if not self.root.is_dir():
            raise UsageError(f"workspace {str(root)!r} is not a folder")
        self._on_located = on_located or (lambda: None)

    def write(self, path: str, data: bytes, *, overwrite: bool) -> int:
        """Create (or, with `overwrite`, replace) the file at `path`; return the bytes written."""
        folder, name = self._locate(path, make_folders=True)
        try:
            mode: int | None = None  # a new file gets 0o666 less the umask, as any new file
            try:
                old = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None:
                if stat.S_ISDIR(old.st_mode):
                    raise WorkspaceError(f"{path} is a folder")
                if not overwrite:
                    raise WorkspaceError("File already exists")
                mode = stat.S_IMODE(old.st_mode)
            self._on_located()
            self._replace(folder, name, data, mode, overwrite)
            return len(data)
        finally:
            os.close(folder)

    def read(self, path: str) -> bytes:
        """The content of the regular file at `path` (at most the 10 MB limit)."""
        for _ in range(_RETRIES):
            folder, name = self._locate(path)
            try:
                self._on_located()
                # O_NONBLOCK: a FIFO must not hang the runtime; it is refused below.
                fd = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
                )
            except FileNotFoundError:
                raise WorkspaceError("File not found") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    continue  # a link appeared after the check: resolve it from the root again
                raise
            finally:
                os.close(folder)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
                raise WorkspaceError(f"{path} is {kind}")
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise WorkspaceError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
            return data
        raise WorkspaceError(f"{path} kept changing while it was opened")

    def delete(self, path: str) -> None:
        """Remove the file at `path`; a link is removed (not its target) if it leads inside."""
        folder, name = self._locate(path, follow_last=False)
        try:
            try:
                info = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                raise WorkspaceError("File not found") from None
            if stat.S_ISDIR(info.st_mode):
                raise WorkspaceError(f"{path} is a folder; deleteFile deletes files only")
            if stat.S_ISLNK(info.st_mode):
                os.close(self._locate(path)[0])  # refused if the link leads out
            self._on_located()
            try:
                os.unlink(name, dir_fd=folder)
            except IsADirectoryError:
                raise WorkspaceError(f"{path} is a folder; deleteFile deletes files only") from None
        finally:
            os.close(folder)

    def folder(self, path: str) -> Path:
        """The real path of the folder `path` names inside the workspace (a shell's cwd)."""
        fd = self._walk(path, make_folders=False, last_is_file=False, follow_last=True)[0]
        try:
            try:
                real = Path(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # no /proc: the lexical answer, checked once more
                real = (self.root / path).resolve()
            real.relative_to(self.root)
            return real
        except ValueError:
            raise OutsideWorkspaceError(f"{path} leads out of the workspace") from None
        finally:
            os.close(fd)

    def _locate(
        self, path: str, *, make_folders: bool = False, follow_last: bool = True
    ) -> tuple[int, str]:
        """A descriptor of the folder that holds `path`'s last component, and that component's
        name (which, when `follow_last`, was not a link at the time of the check)."""
        fd, name = self._walk(
            path, make_folders=make_folders, last_is_file=True, follow_last=follow_last
        )
        if name is None:
            os.close(fd)
            raise WorkspaceError(f"{path or '.'} names a folder, not a file")
        return fd, name

    def _walk(
        self, path: str, *, make_folders: bool, last_is_file: bool, follow_last: bool
    ) -> tuple[int, str | None]:
        problem = path_problem(path)  # the protocol's rule, held here too for every caller
        if problem:
            outside = path.startswith("/") or ".." in path
            raise (OutsideWorkspaceError if outside else WorkspaceError)(f"{path!r} {problem}")
        pending: deque[str] = deque(path.split("/"))
        stack = [os.open(self.root, _DIR)]
        links = 0
        try:
            while pending:
                name = pending.popleft()
                if name in ("", "."):
                    continue
                if name == "..":
                    if len(stack) == 1:
                        raise OutsideWorkspaceError(f"{path} leads out of the workspace")
                    os.close(stack.pop())
                    continue
                last = all(p in ("", ".") for p in pending)
                if last and last_is_file:
                    try:
                        info = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                    except FileNotFoundError:
                        return self._keep_last(stack), name
                    if not (follow_last and stat.S_ISLNK(info.st_mode)):
                        return self._keep_last(stack), name
                else:
                    try:
                        stack.append(os.open(name, _DIR, dir_fd=stack[-1]))
                        continue
                    except FileNotFoundError:
                        if not make_folders:
                            raise WorkspaceError(f"{path}: folder {name!r} not found") from None
                        try:
                            os.mkdir(name, 0o777, dir_fd=stack[-1])
                        except FileExistsError:
                            pass  # made meanwhile: open it on the next turn
                        pending.appendleft(name)
                        continue
                    except OSError as exc:
                        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                            raise
                # A link (or, in the middle, something that is not a folder).
                try:
                    target = os.readlink(name, dir_fd=stack[-1])
                except OSError:
                    raise WorkspaceError(f"{path}: {name!r} is not a folder") from None
                links += 1
                if links > MAX_LINKS:
                    raise WorkspaceError(f"{path}: too many levels of symbolic links")
                if target.startswith("/"):
                    try:
                        inside = Path(target).relative_to(self.root)
                    except ValueError:
                        raise OutsideWorkspaceError(
                            f"{path} leads out of the workspace (a link to {target})"
                        ) from None
                    while len(stack) > 1:
                        os.close(stack.pop())
                    target = str(inside)
                pending.extendleft(reversed(target.split("/")))
            return self._keep_last(stack), None
        except BaseException:
            for fd in stack:
                os.close(fd)
            raise

    @staticmethod
    def _keep_last(stack: list[int]) -> int:
        for fd in stack[:-1]:
            os.close(fd)
        last = stack[-1]
        stack.clear()
        return last

    @staticmethod
    def _replace(folder: int, name: str, data: bytes, mode: int | None, overwrite: bool) -> None:
        temp = f".ops-{secrets.token_hex(6)}.tmp"  # short: `name` may be at the 255-byte limit
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o666, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if mode is not None:  # a replaced file keeps its permissions
                    os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            if overwrite:
                os.rename(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
            else:
                try:  # link, unlike rename, refuses a file that appeared since the check
                    os.link(temp, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
                except FileExistsError:
                    raise WorkspaceError("File already exists") from None
                finally:
                    os.unlink(temp, dir_fd=folder)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=folder)
            except OSError:
                pass  # already gone (the link path removes it itself)
            raise
