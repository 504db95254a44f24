"""Starting a child with ``posix_spawn``, before ``subprocess`` is imported: standard
library only.

The watchdog and the agent started early (:mod:`acp_bridge.commands.launch`) are spawned
before the bridge has loaded anything else, and every millisecond there comes before the
agent's own start. ``subprocess`` brings ``signal``, ``enum``, ``locale``, ``re``,
``selectors`` and ``threading`` with it: 9.3-10.2 ms in a fresh interpreter, and start ->
``initialize`` answer went from 72 to 58 ms without them (bench/README.md, "fifteenth
run"). ``os.posix_spawnp`` needs none of them. :class:`Child` is the part of
``subprocess.Popen`` the bridge uses of these two processes.

What ``Popen`` does for them, done here too:

* the child gets the pipes (or ``/dev/null``) on its stdin and stdout, and the bridge's
  stderr; pipe ends that land on a standard descriptor the bridge was started without are
  moved above stderr first;
* no other descriptor: every descriptor Python opens is close-on-exec already, and those
  the bridge inherited from its own parent are made so before the spawn
  (:func:`_close_inherited_on_exec`; ``Popen``'s ``close_fds`` closes them in the child);
* SIGPIPE and SIGXFSZ, which Python ignores, are back to their default actions
  (``restore_signals``); the handlers the bridge set are reset by the exec itself;
* its own session (``start_new_session``): a group of its own, which a signal to the
  bridge's group does not reach;
* an executable without a ``/`` is looked up in ``PATH``; one that cannot run raises
  ``OSError`` in the caller.
"""

from __future__ import annotations

import contextlib
import os
import time

# The numbers ``signal`` names, without the ``enum`` it builds to name them.
from _signal import SIGKILL, SIGPIPE, SIGXFSZ  # type: ignore[import-not-found]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Final

PIPE: Final = -1
DEVNULL: Final = -3
# How often a wait with a timeout looks (as ``Popen.wait`` does, at most this long).
_WAIT_STEP: Final = 0.05


class Child:
    """A process :func:`spawn` started: its pid, the bridge's ends of its pipes (file
    descriptors the caller owns, None where there is no pipe), and its exit status once it
    is reaped (as ``Popen.returncode``: ``-N`` when signal N ended it)."""

    __slots__ = ("pid", "returncode", "stdin", "stdout")

    def __init__(self, pid: int, stdin: int | None, stdout: int | None) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status if the child has exited (it is reaped then), else None."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit; its status. Raises ``TimeoutError`` after
        ``timeout`` seconds."""
        if timeout is None:
            while self.returncode is None:
                self._reap(0)
            return self.returncode
        deadline = time.monotonic() + timeout
        while (status := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"process {self.pid} still runs after {timeout} s")
            time.sleep(min(left, _WAIT_STEP))
        return status

    def kill(self) -> None:
        """SIGKILL the child, unless it has been reaped (its pid may be another's now)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, SIGKILL)

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:
            # Reaped elsewhere (SIGCHLD ignored, say): its status is lost, as Popen has it.
            self.returncode = 0
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: int = PIPE,
    stdout: int = PIPE,
) -> Child:
    """Start ``argv`` in a session of its own. ``stdin`` and ``stdout``: :data:`PIPE`
    (the bridge's end is on the :class:`Child`), :data:`DEVNULL`, or a descriptor the
    child gets (the caller keeps and closes its own). Raises ``OSError`` (and
    ``ValueError`` for a NUL byte in an argument or variable) if it cannot start."""
    _close_inherited_on_exec()
    ours: list[int] = []  # the bridge's ends of the pipes
    theirs: list[int] = []  # the child's, closed here once it has them
    actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = []
    try:
        for target, given in ((0, stdin), (1, stdout)):
            if given == DEVNULL:
                flags = os.O_RDONLY if target == 0 else os.O_WRONLY
                actions.append((os.POSIX_SPAWN_OPEN, target, os.devnull, flags, 0))
                continue
            if given == PIPE:
                read_end, write_end = os.pipe()  # both close-on-exec
                mine, child = (write_end, read_end) if target == 0 else (read_end, write_end)
                ours.append(mine)
                theirs.append(child)
            else:
                child = given
            if child <= 2:
                # On a standard descriptor the bridge was started without: the child's
                # ends are moved above them first, so that no dup2 overwrites another
                # (or lands on itself, which would leave it close-on-exec).
                child = _above_stderr(child)
                theirs.append(child)
            actions.append((os.POSIX_SPAWN_DUP2, child, target))
        try:
            pid = os.posix_spawnp(
                argv[0],
                list(argv),
                os.environ if env is None else env,
                file_actions=actions,
                setsigdef=(SIGPIPE, SIGXFSZ),
                setsid=True,
            )
        except NotImplementedError as exc:  # no setsid for posix_spawn on this system
            raise OSError(f"cannot start a process in a session of its own: {exc}") from exc
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    pipes = iter(ours)
    return Child(
        pid,
        next(pipes) if stdin == PIPE else None,
        next(pipes) if stdout == PIPE else None,
    )


def _above_stderr(fd: int) -> int:
    """A close-on-exec copy of ``fd`` numbered above stderr."""
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


def _close_inherited_on_exec() -> None:
    """Make every descriptor above stderr that a child would inherit close-on-exec: the
    ones the bridge itself was started with (Python opens its own so)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return  # no /proc: nothing to go by; Python's own descriptors are safe anyway
    for name in names:
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)
