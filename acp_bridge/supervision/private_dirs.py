"""The private folders a pool writes prompt text into, one per agent process, and what
becomes of them when the bridge dies.

A folder is made 0700 (every folder inside it too) and its files 0600. While it exists:

* the bridge that made it holds it locked (``flock`` on the folder), so another bridge
  can tell a folder in use from one a dead bridge left;
* it is named to a watchdog (:class:`~acp_bridge.supervision.agent_watchdog.Watchdog`) as soon as
  it exists, before any prompt text is written into it: should the bridge be killed,
  at whatever moment, the watchdog removes it.

The bridge removes it itself when its process stops. What neither could remove (the
watchdog killed together with the bridge, the machine stopped) is removed by the next
bridge that starts with the same adapter and folder root (:func:`sweep`): every folder
of this user with the adapter's prefix that nothing holds locked. A folder made by a
bridge older than this scheme holds no lock either, and is removed as left behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Final

from acp_bridge.supervision.agent_watchdog import Watchdog

# A sweep by another bridge may take a folder between its creation and its lock (it is
# empty then); the folder is made again under another name, this many times at most.
CREATE_ATTEMPTS: Final = 8


class PrivateDir:
    """A directory only the user can enter (0700), made for one pooled process (or for one
    ``acp-bridge verify`` run: its home).

    Files written here are 0600. The pool removes the whole directory when the process
    stops, is reaped or the bridge shuts down; ``keeper``, the watchdog it was named to,
    removes it should the bridge die first.
    """

    def __init__(self, path: Path, lock: int | None = None, keeper: Watchdog | None = None) -> None:
        self.path = path
        self._lock = lock
        self._keeper = keeper

    @classmethod
    def create(
        cls, prefix: str, root: Path | None = None, keeper: Watchdog | None = None
    ) -> PrivateDir:
        """A new folder ``root/prefix…`` (``root``: the system's temporary folder)."""
        if root is not None:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for _ in range(CREATE_ATTEMPTS):
            path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))  # mkdtemp: 0700
            if keeper is not None:
                keeper.own(str(path))
            lock = _lock(path)
            if lock is not None:
                return cls(path, lock, keeper)
            if keeper is not None:
                keeper.disown(str(path))
        where = root if root is not None else tempfile.gettempdir()
        raise OSError(errno.EAGAIN, f"no private folder could be kept in {where}")

    def _inside(self, name: str) -> Path:
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ValueError(f"{name!r} is not a plain path inside the private directory")
        return self.path.joinpath(*relative.parts)

    def _make_folders(self, path: Path) -> None:
        """``path`` and every missing folder between it and the directory, each 0700
        (``Path.mkdir(parents=True)`` gives the parents the umask's mode)."""
        folder = self.path
        for part in path.relative_to(self.path).parts:
            folder = folder / part
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)

    def mkdir(self, name: str) -> Path:
        """A sub-directory (0700), parents included."""
        path = self._inside(name)
        self._make_folders(path)
        return path

    def write(self, name: str, text: str) -> Path:
        """Write ``text`` (UTF-8) to a new file readable only by the user; its path."""
        path = self._inside(name)
        self._make_folders(path.parent)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        return path

    def link(self, name: str, target: Path) -> Path:
        """A symbolic link to ``target`` (for carrying a user's own file over)."""
        path = self._inside(name)
        self._make_folders(path.parent)
        path.symlink_to(target)
        return path

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self.keep()

    def keep(self) -> None:
        """Leave the folder where it is, for the user: no watchdog removes it any more, and
        nothing holds it (``acp-bridge verify --keep-home``)."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.disown(str(self.path))
        self._unlock()

    def _unlock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            os.close(lock)

    def __del__(self) -> None:
        with contextlib.suppress(AttributeError, OSError):
            self._unlock()


def _lock(path: Path) -> int | None:
    """A descriptor holding ``path`` (a folder) locked, or None when another process holds
    it, or it is gone (or was replaced) since it was named."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except OSError:
        held = False
    if not held:
        os.close(fd)
        return None
    return fd


def sweep(prefix: str, root: Path | None = None) -> int:
    """Remove the folders ``root/prefix…`` of this user that no process holds locked:
    what a dead bridge left. How many were removed."""
    directory = root if root is not None else Path(tempfile.gettempdir())
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        try:
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        lock = _lock(Path(entry.path))
        if lock is None:
            continue  # in use, or gone
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            os.close(lock)
    return removed
