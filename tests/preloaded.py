"""Bridge processes forked from one that has already imported the bridge.

A ``python -m acp_bridge`` process spends about nine tenths of its CPU starting the
interpreter and importing trio, pydantic, click and the bridge, the same for every test.
The tests whose subject is what a running bridge process does (supervision, shutdown,
signals, the store, byte-exact relaying) start it from here instead: a server process,
started once per test session, imports what a run of the bridge imports, and forks a child
for each bridge asked of it; the child takes the test's pipes as its stdin, stdout and
stderr, the test's environment, working folder and arguments, and runs ``acp_bridge`` as
``python -m`` does, from its ``__main__`` on, to the interpreter's own exit. multiprocessing's
``forkserver`` start method works the same way.

What differs from ``python -m acp_bridge`` is only what comes before ``__main__``: the
interpreter's start and the imports. The tests of that start (the early spawn and
``initialize`` answer, the agent killed while the runtime loads, the console command) keep
running ``python -m acp_bridge``.

The child is the server's, not the test's: :class:`PreloadedProcess` stands in for
``trio.Process`` where the tests use one (``pid``, ``stdin``, ``stdout``, ``returncode``,
``wait``, ``send_signal``, ``kill``), signals it through a pidfd (no pid is signalled after
it was reused) and gets its exit status, and the CPU it and its reaped descendants used,
from the server. ``pytest --report-processes`` counts each fork as a process start and
charges its CPU to the test that started it.

Run as a script it is the server: ``python tests/preloaded.py FD``, ``FD`` a listening unix
socket, its stdin the session's end (EOF: it exits once its last child is reaped).
"""

from __future__ import annotations

import array
import contextlib
import gc
import io
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import trio

import acp_bridge.__main__ as entry
from acp_bridge.runtime.client import AcpClient, client_of

# The request: a JSON header and, as SCM_RIGHTS, the child's stdin, stdout and stderr.
MAX_REQUEST: Final = 1 << 20
# The answers: the child's pid (and its pidfd, as SCM_RIGHTS), then its end.
PID: Final = struct.Struct("!i")
END: Final = struct.Struct("!idd")  # exit code (-N: signal N), user and system CPU seconds
SOCKET: Final = "preloaded.sock"  # the server's address, in a folder of its own


# --------------------------------------------------------------------------- the server


def preload() -> None:
    """Import what a run of the bridge imports, with the collector off as the entry point
    has it while it loads, and freeze it."""
    gc.disable()
    import acp_bridge.commands.cli
    import acp_bridge.runtime.relay
    import acp_bridge.settings

    acp_bridge.settings.load_config()  # yaml's and pydantic's lazily built parts
    gc.collect()
    # What is loaded lives as long as every fork: frozen, no fork's collector walks it (a
    # walk writes to every object, so each fork would copy the pages of the whole heap).
    # The bridge freezes them itself once its relay is loaded (cli.run_stdio); until then,
    # and in the commands that never get there (verify, sessions), a fork's collections
    # walked them.
    gc.freeze()
    gc.enable()


@dataclass
class Child:
    pid: int
    pidfd: int
    answer: socket.socket


@dataclass
class Server:
    listener: socket.socket
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    children: dict[int, Child] = field(default_factory=dict)  # by pidfd
    ending: bool = False

    def run(self) -> dict[str, Any] | None:
        """Serve until the session ends (``None``); in a forked child, its request."""
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "end")
        while not (self.ending and not self.children):
            for key, _ in self.selector.select():
                if key.data == "accept":
                    connection, _address = self.listener.accept()
                    request = self._fork(connection)
                    if request is not None:
                        return request
                elif key.data == "end":
                    self.ending = True
                    self.selector.unregister(key.fileobj)
                    self.selector.unregister(self.listener)
                    self._remove_address()
                else:
                    self._reap(key.data)
        return None

    def _remove_address(self) -> None:
        """Remove the socket and its folder: the session's end may be a test session
        that was killed, which never got to remove them (:meth:`Preloader.close`)."""
        address = Path(self.listener.getsockname())
        with contextlib.suppress(OSError):
            address.unlink()
            address.parent.rmdir()

    def _fork(self, connection: socket.socket) -> dict[str, Any] | None:
        fds = array.array("i")
        data, ancillary, _flags, _address = connection.recvmsg(
            MAX_REQUEST, socket.CMSG_SPACE(3 * fds.itemsize)
        )
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            self._become_child(connection, list(fds))
            return dict(request)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        connection.sendmsg(
            [PID.pack(pid)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))]
        )
        self.children[pidfd] = Child(pid, pidfd, connection)
        self.selector.register(pidfd, selectors.EVENT_READ, pidfd)
        return None

    def _reap(self, pidfd: int) -> None:
        child = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _pid, status, usage = os.wait4(child.pid, 0)
        with contextlib.suppress(OSError):  # the test is gone
            child.answer.sendall(
                END.pack(os.waitstatus_to_exitcode(status), usage.ru_utime, usage.ru_stime)
            )
        child.answer.close()

    def _become_child(self, connection: socket.socket, fds: list[int]) -> None:
        """In the fork: the received pipes as 0, 1 and 2, nothing of the server's open."""
        for target, fd in enumerate(fds):
            os.dup2(fd, target)  # dup2 leaves the copy inheritable, as Popen's child has it
        for fd in fds:
            if fd > 2:
                os.close(fd)
        self.selector.close()
        self.listener.close()
        connection.close()
        for child in self.children.values():
            os.close(child.pidfd)
            child.answer.close()


def run_child(request: Mapping[str, Any]) -> None:
    """Become ``python -m acp_bridge ARGS`` in the request's folder and environment: its
    ``__main__``'s ``main()``, then the interpreter's own exit (``atexit``, the exit status
    of a ``SystemExit``, a traceback and status 1 for anything else)."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [entry.__file__, *request["args"]]
    sys.path[0] = os.getcwd()  # what ``-m`` puts first
    unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        assert isinstance(stream, io.TextIOWrapper)
        stream.reconfigure(write_through=unbuffered)
    entry.main()


def serve(listener_fd: int) -> None:
    preload()
    listener = socket.socket(fileno=listener_fd)
    request = Server(listener).run()
    if request is not None:
        del listener
        run_child(request)


# --------------------------------------------------------------------------- the client


class PreloadedProcess:
    """A bridge forked by the server: what the tests use of ``trio.Process``."""

    def __init__(
        self,
        pid: int,
        pidfd: int,
        answer: trio.socket.SocketType,
        stdin: trio.lowlevel.FdStream | None,
        stdout: trio.lowlevel.FdStream | None,
        *,
        stderr: trio.lowlevel.FdStream | None = None,
    ) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._answer = answer
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    async def wait(self) -> int:
        if self.returncode is None:
            data = b""
            while len(data) < END.size:
                chunk = await self._answer.recv(END.size - len(data))
                if not chunk:
                    raise RuntimeError("the preloaded bridge server went away")
                data += chunk
            code, user, system = END.unpack(data)
            charge_cpu(user + system)
            self.returncode = code
            self._answer.close()
            os.close(self._pidfd)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # exited, not reaped yet
                signal.pidfd_send_signal(self._pidfd, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def charge_cpu(seconds: float) -> None:
    """Counted by ``pytest --report-processes`` (it wraps this): the CPU a forked bridge
    used, which the test's process does not see until the server exits."""


def _request_fork(
    address: str, args: Sequence[str], env: Mapping[str, str], cwd: str, fds: Sequence[int]
) -> tuple[socket.socket, int, int]:
    """One fork asked of the server (wrapped by ``pytest --report-processes``, a start)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(address)
        header = json.dumps({"args": list(args), "env": dict(env), "cwd": cwd}).encode()
        connection.sendmsg(
            [header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        )
        received = array.array("i")
        data, ancillary, _flags, _address = connection.recvmsg(
            PID.size, socket.CMSG_SPACE(received.itemsize)
        )
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received.frombytes(payload[: received.itemsize])
        if len(data) != PID.size or not received:
            raise RuntimeError("the preloaded bridge server did not fork")
        (pid,) = PID.unpack(data)
        return connection, pid, received[0]
    except BaseException:
        connection.close()
        raise


@dataclass
class Preloader:
    """A server: :meth:`start` forks bridges from it."""

    process: subprocess.Popen[bytes]
    folder: Path

    @property
    def address(self) -> str:
        return str(self.folder / SOCKET)

    @classmethod
    def launch(cls) -> Preloader:
        folder = Path(tempfile.mkdtemp(prefix="acp-bridge-preloaded-"))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(folder / SOCKET))
            listener.listen(64)
            process = subprocess.Popen(
                [sys.executable, __file__, str(listener.fileno())],
                stdin=subprocess.PIPE,
                pass_fds=[listener.fileno()],
            )
        finally:
            listener.close()
        return cls(process, folder)

    def close(self) -> None:
        """The server exits once its last child is reaped, and is waited for here (so the
        CPU its children used is counted in this process's)."""
        stdin: IO[bytes] | None = self.process.stdin
        if stdin is not None:
            stdin.close()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    async def start(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        stderr: int | IO[Any] | None = None,
        cwd: str | None = None,
    ) -> PreloadedProcess:
        """``python -m acp_bridge ARGS`` forked, its stdin and stdout pipes to this process,
        its stderr ``stderr`` (this process's by default; a pipe to this process, as
        ``process.stderr``, for ``subprocess.PIPE``)."""
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        if stderr == subprocess.PIPE:
            stderr_read, error = os.pipe()
        else:
            stderr_read = -1
            error = 2 if stderr is None else stderr if isinstance(stderr, int) else stderr.fileno()
        try:
            connection, pid, pidfd = await trio.to_thread.run_sync(
                lambda: _request_fork(
                    self.address,
                    args,
                    env,
                    cwd or os.getcwd(),
                    [stdin_read, stdout_write, error],
                )
            )
        except BaseException:
            for fd in (stdin_write, stdout_read, stderr_read):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
            if stderr_read >= 0:
                os.close(error)  # the pipe's write end, the child's now
        return PreloadedProcess(
            pid,
            pidfd,
            trio.socket.from_stdlib_socket(connection),
            trio.lowlevel.FdStream(stdin_write),
            trio.lowlevel.FdStream(stdout_read),
            stderr=trio.lowlevel.FdStream(stderr_read) if stderr_read >= 0 else None,
        )


class _Session:
    """The test session's server, started at the first fork asked of it."""

    server: Preloader | None = None


async def start_bridge(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    stderr: int | IO[Any] | None = None,
    cwd: str | None = None,
) -> PreloadedProcess:
    """``python -m acp_bridge ARGS``, forked from the session's server."""
    if _Session.server is None:
        _Session.server = Preloader.launch()
    return await _Session.server.start(args, env=env, stderr=stderr, cwd=cwd)


@asynccontextmanager
async def bridge_client(
    args: Sequence[str], env: Mapping[str, str]
) -> AsyncIterator[tuple[AcpClient, PreloadedProcess]]:
    """:func:`acp_bridge.runtime.client.spawn_bridge` for a forked bridge."""
    process = await start_bridge(args, env=env)
    async with client_of(process) as client:
        yield client, process


@dataclass(frozen=True)
class Ran:
    """A forked bridge run to its end: what :func:`subprocess.run` returns of it."""

    returncode: int
    stdout: bytes
    stderr: bytes


async def run(
    args: Sequence[str],
    *,
    stdin: bytes = b"",
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Ran:
    """``subprocess.run([python, "-m", "acp_bridge", *args], input=stdin,
    capture_output=True)``, forked from the session's server: ``stdin`` written and closed,
    stdout and stderr read to their ends, the exit waited for (killed if cancelled)."""
    process = await start_bridge(
        args, env=dict(os.environ) if env is None else env, stderr=subprocess.PIPE, cwd=cwd
    )
    stdout, stderr = bytearray(), bytearray()

    async def feed(stream: trio.abc.SendStream) -> None:
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(stdin)

    async def drain(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
        async with stream:
            while chunk := await stream.receive_some():
                into += chunk

    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed, process.stdin)
            nursery.start_soon(drain, process.stdout, stdout)
            nursery.start_soon(drain, process.stderr, stderr)
        returncode = await process.wait()
    except BaseException:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
        raise
    return Ran(returncode, bytes(stdout), bytes(stderr))


def run_to_end(
    args: Sequence[str],
    *,
    stdin: bytes = b"",
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 30.0,
) -> Ran:
    """:func:`run` for a test that is not async, within ``timeout`` seconds."""

    async def bounded() -> Ran:
        with trio.fail_after(timeout):
            return await run(args, stdin=stdin, env=env, cwd=cwd)

    return trio.run(bounded)


def end_session() -> None:
    """Stop the session's server, if one was started (``conftest.pytest_sessionfinish``)."""
    server, _Session.server = _Session.server, None
    if server is not None:
        server.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
