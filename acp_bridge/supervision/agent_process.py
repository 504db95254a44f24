"""Supervision of one agent process: spawn in its own process group, quick orderly shutdown,
and nothing left behind even when the bridge itself is killed.

The agent gets the bridge's full environment plus configured extras (editors pass API
keys through the environment, so nothing is trimmed). Its stderr is the bridge's stderr.

Shutdown closes stdin and gives the agent a moment (:data:`EOF_WAIT`) to exit by itself,
then signals the whole process group (SIGTERM, then SIGKILL after the grace), so wrappers
such as ``npx`` cannot leave their child behind. Should the bridge die without shutting
down (an editor SIGKILLs it), a watchdog process per group (``agent_watchdog.py``) ends
the group and removes the agent's private files. The watchdog is started before the
agent, and the agent carries its mark in its environment until the bridge names its group
(an agent started before the runtime loaded brings its own,
:mod:`acp_bridge.commands.launch`): there is no moment when an agent runs unwatched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Final

import trio

from acp_bridge.supervision.agent_watchdog import (
    GRACE,
    Processes,
    Watchdog,
    any_running,
    outside_group,
    signal_processes,
)
from acp_bridge.supervision.spawn import Child
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, JsonObject, error_object

log = logging.getLogger("acp_bridge.agent")

# How often to look whether a signalled process group has emptied.
_GROUP_POLL: Final = 0.02
# How long an agent gets to exit by itself after stdin EOF before it is sent SIGTERM. The
# agents that do exit on EOF take 0.1-0.4 s; clients (the ACP SDKs) SIGKILL a proxy that
# takes 2 s to go, so the whole shutdown must fit in well under a second.
EOF_WAIT: Final = 0.4
# How long the watchdog lets a group of an already dead bridge handle SIGTERM.
WATCHDOG_GRACE: Final = GRACE


def prepare_watchdog() -> None:
    """Start the next agent's watchdog now (:meth:`Watchdog.prepare`): for a connection
    that starts agent after agent (a pool's), whose next agent then starts without
    waiting for a watchdog's start-up."""
    try:
        Watchdog.prepare(WATCHDOG_GRACE)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        # It runs in a task of its own, whose failure would end the bridge: the next
        # start starts its own watchdog instead, or says why it cannot.
        log.debug("no watchdog started ahead: %s", exc)


def cancel_prepared_watchdog() -> None:
    """End the watchdog :func:`prepare_watchdog` started, if no agent's start took it."""
    Watchdog.cancel_prepared(WATCHDOG_GRACE)


class AgentStartError(Exception):
    """The agent command could not be started: ``command`` (argv[0]) and ``cause`` in words."""

    def __init__(self, command: str, cause: str) -> None:
        super().__init__(f"The agent command {command!r} could not be started: {cause}.")
        self.command = command
        self.cause = cause

    def error_object(self) -> JsonObject:
        """The JSON-RPC error a client gets for its ``initialize`` when the agent cannot start."""
        return error_object(
            INTERNAL_ERROR, str(self), {"command": self.command, "cause": self.cause}
        )


def _describe_start_failure(exc: BaseException, command: str, cwd: str | None) -> str:
    if isinstance(exc, FileNotFoundError):
        missing = exc.filename
        if cwd is not None and missing == cwd:
            return f"its working directory {cwd} does not exist"
        return f"{exc.strerror or 'No such file or directory'} (is it installed and on PATH?)"
    if isinstance(exc, PermissionError):
        return f"{exc.strerror or 'Permission denied'} (is it an executable file?)"
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOEXEC:
            return f"{reason} (not a program, and no #! line)"
        return reason
    return str(exc) or type(exc).__name__


# Pipes the bridge reads and writes hold this much (Linux's default is 64 KiB, and a
# process may raise its own pipes to /proc/sys/fs/pipe-max-size, 1 MiB by default): a large
# frame then crosses in a sixteenth of the reads and writes, and a pump wakes less often.
PIPE_SIZE: Final = 1 << 20


def widen_pipe(fd: int) -> None:
    """Give the pipe behind ``fd`` room for :data:`PIPE_SIZE` bytes, where allowed."""
    with contextlib.suppress(OSError):  # not a pipe, or over the system's maximum
        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < PIPE_SIZE:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)


class StartedProcess:
    """A child started before trio ran (:func:`acp_bridge.supervision.spawn.spawn`), as
    trio's ``Process`` is used here: its pipes become trio streams, which own them."""

    def __init__(self, popen: Child) -> None:
        assert popen.stdin is not None and popen.stdout is not None
        self._popen = popen
        self.pid = popen.pid
        self.stdin: trio.abc.SendStream = trio.lowlevel.FdStream(popen.stdin)
        self.stdout: trio.abc.ReceiveStream = trio.lowlevel.FdStream(popen.stdout)
        popen.stdin = popen.stdout = None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        status = self._popen.poll()
        if status is not None:
            return status
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd (old kernel): look now and then
            while (status := self._popen.poll()) is None:
                await trio.sleep(_GROUP_POLL)
            return status
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        return self._popen.wait()


class AgentProcess:
    """A running agent. Use :meth:`start`, read ``stdout``, write ``stdin``, then :meth:`stop`."""

    def __init__(
        self,
        process: trio.Process | StartedProcess,
        argv: Sequence[str],
        *,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.process = process
        self.argv = list(argv)
        assert process.stdin is not None and process.stdout is not None
        self.stdin: trio.abc.SendStream = process.stdin
        self.stdout: trio.abc.ReceiveStream = process.stdout
        for stream in (process.stdin, process.stdout):
            fileno = getattr(stream, "fileno", None)  # trio's pipe streams have one
            if fileno is not None:
                widen_pipe(fileno())
        self.pgid = process.pid  # start_new_session makes the child its group leader
        self._stdin_closed = False
        self.terminated_by_bridge = False
        self._watchdog = watchdog
        # Descendants that left the agent's group (setsid), seen while the tree stood.
        self._escaped: Processes = {}

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        extra_env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        private_files: Sequence[str] = (),
        stderr: int | None = None,
    ) -> AgentProcess:
        """Start ``argv`` in a new process group, watched until :meth:`stop`.

        Its stderr is the bridge's, or the file descriptor ``stderr``.

        ``private_files`` (paths, e.g. a prompt file the agent reads) are removed by the
        watchdog should the bridge die before it could clean up itself.
        Raises :class:`AgentStartError` if the command cannot be started.
        """
        if not argv:
            raise AgentStartError("", "the command is empty")
        try:
            watchdog = Watchdog.start(WATCHDOG_GRACE)
        except OSError as exc:
            cause = f"its watchdog could not start: {exc.strerror or exc}"
            raise AgentStartError(argv[0], cause) from exc
        for path in private_files:
            watchdog.own(os.fspath(path))
        env = watchdog.mark({**os.environ, **(extra_env or {})})
        try:
            process = await trio.lowlevel.open_process(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            watchdog.discard()
            # ValueError: an argument or variable with a NUL byte, say.
            cause = _describe_start_failure(exc, argv[0], cwd)
            raise AgentStartError(argv[0], cause) from exc
        except BaseException:
            watchdog.discard()
            raise
        watchdog.watch(process.pid)
        log.debug("started agent pid %d: %s", process.pid, argv[0])
        return cls(process, argv, watchdog=watchdog)

    @classmethod
    def adopt(cls, popen: Child, argv: Sequence[str], watchdog: Watchdog) -> AgentProcess:
        """Take over an agent started before trio ran (see :mod:`acp_bridge.commands.launch`),
        with the watchdog it was started under: its pipes become trio streams."""
        process = StartedProcess(popen)
        log.debug("adopted agent pid %d: %s", process.pid, argv[0])
        return cls(process, argv, watchdog=watchdog)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    async def close_stdin(self) -> None:
        if not self._stdin_closed:
            self._stdin_closed = True
            gone = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
            with trio.move_on_after(1), contextlib.suppress(*gone):
                await self.stdin.aclose()

    def signal_group(self, signum: int) -> bool:
        """Signal every process in the agent's group; False when the group is empty.

        Descendants found outside the group (:meth:`_note_escaped`) get the signal too,
        except for the existence probe (signal 0).
        """
        if signum:
            signal_processes(self._escaped, signum)
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        return True

    def _note_escaped(self) -> None:
        """Remember the agent's descendants that left its group, while the agent still
        stands to lead to them (once it exits they belong to init)."""
        if self.process.returncode is None:
            self._escaped.update(outside_group(self.pid, self.pgid))

    def group_alive(self) -> bool:
        """Whether any process of the agent's group still runs (zombies do not count)."""
        if not self.signal_group(0):
            return False
        if self.process.returncode is None:
            return True
        # The leader is gone and reaped: what answers may be orphans that exited but wait
        # for init to reap them, which some inits do only every second or so.
        return _group_has_running_member(self.pgid)

    async def _wait_group(self, timeout: float) -> bool:
        """Wait until the agent and everything in its group has gone; True if it did."""
        with trio.move_on_after(timeout) as scope:
            await self.process.wait()
            while self.group_alive() or any_running(self._escaped):
                await trio.sleep(_GROUP_POLL)
        return not scope.cancelled_caught

    async def stop(self, grace: float, *, eof_wait: float = EOF_WAIT) -> int:
        """Close stdin, wait ``eof_wait``, SIGTERM the group, wait ``grace``, SIGKILL the
        group. Returns the agent's status.

        Shielded: shutdown must finish even when the caller is being cancelled.
        """
        with trio.CancelScope(shield=True):
            self._note_escaped()
            await self.close_stdin()
            if not await self._wait_group(min(eof_wait, grace)):
                log.debug("agent pid %d still running after EOF; sending SIGTERM", self.pid)
                self.terminated_by_bridge = self.process.returncode is None
                self._note_escaped()
                self.signal_group(signal.SIGTERM)
                # As systemd does: a stopped process (SIGSTOP, a debugger) acts on the
                # SIGTERM only once continued; otherwise it would wait for the SIGKILL.
                self.signal_group(signal.SIGCONT)
                if not await self._wait_group(grace):
                    log.warning("agent pid %d ignored SIGTERM; sending SIGKILL", self.pid)
                    self._note_escaped()
                    self.signal_group(signal.SIGKILL)
                    await self.process.wait()
                    # Give the kernel a moment to reap the rest of the group.
                    await self._wait_group(grace)
            status = await self.process.wait()
            await self._release_watchdog()
        return status

    async def _release_watchdog(self) -> None:
        """The group is gone: tell the watchdog so."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.release()

    # An AgentProcess dropped without stop(): its watchdog, dropped with it, ends the
    # group, as if the bridge had died.


def _group_has_running_member(pgid: int) -> bool:
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no /proc: trust kill(0)
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            return True
    return False
