"""An agent run in a thread of the test over two pipes: file descriptors, as a process has.

:func:`acp_bridge.runtime.early_initialize.exchange` works on raw file descriptors before
trio runs, so an agent it talks to must answer from another thread, over real pipes.
:class:`ThreadedAgent` is such an agent (a function of what it reads, that writes what it
answers) and, once the runtime takes over, the ``AgentHandle`` the runtime adopts: the
bridge's ends of the same pipes as trio streams, a made-up pid, and the function's return
value as its exit status. Every line it reads is recorded, as ``--record`` does.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import fake_agent
import trio

from acp_bridge.supervision.agent_process import EOF_WAIT


class Pipe:
    """The agent's side: lines read from the bridge, bytes written to it."""

    def __init__(self, read_fd: int, write_fd: int, received: bytearray) -> None:
        self._reader = os.fdopen(read_fd, "rb", buffering=0)
        self._writer = os.fdopen(write_fd, "wb", buffering=0)
        self._buffer = b""
        self.received = received

    def readline(self) -> bytes:
        """The next line with its terminator (b"" at EOF; the last, unterminated, as is)."""
        while b"\n" not in self._buffer:
            data = self._reader.read(1 << 16)
            if not data:
                line, self._buffer = self._buffer, b""
                break
            self._buffer += data
        else:
            end = self._buffer.index(b"\n") + 1
            line, self._buffer = self._buffer[:end], self._buffer[end:]
        self.received += line if not line or line.endswith(b"\n") else line + b"\n"
        return line

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def write(self, data: bytes) -> None:
        """Write ``data`` at once, as one write of a process's flushed stdout."""
        with contextlib.suppress(BrokenPipeError):
            self._writer.write(data)

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


AgentFunction = Callable[[Pipe], int]
"""What the agent does with its pipe; returns its exit status."""


class ThreadedAgent:
    """``function`` run in a thread over a new pair of pipes, once ``start`` is called."""

    pid = 30_000

    def __init__(self, function: AgentFunction, *, start_after: threading.Event | None = None):
        self.function = function
        self.start_after = start_after
        to_agent_r, self.to_agent = os.pipe()
        self.from_agent, from_agent_w = os.pipe()
        self.received = bytearray()
        self._pipe = Pipe(to_agent_r, from_agent_w, self.received)
        self.returncode: int | None = None
        self.terminated_by_bridge = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._exited = threading.Event()
        # The runtime's ends, made when it takes over (FdStream needs a running trio).
        self.stdin: Any = None
        self.stdout: Any = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        status = 1
        try:
            if self.start_after is not None:
                self.start_after.wait()
            status = self.function(self._pipe)
        finally:
            self._pipe.close()
            self.returncode = status
            self._exited.set()

    def take_over(self) -> None:
        """The bridge's ends as trio streams, for the runtime (in trio)."""
        self.stdin = trio.lowlevel.FdStream(self.to_agent)
        self.stdout = trio.lowlevel.FdStream(self.from_agent)

    def close(self) -> None:
        """Close the bridge's ends, if the runtime never took them."""
        if self.stdin is None:
            for fd in (self.to_agent, self.from_agent):
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def wait(self) -> int:
        await trio.to_thread.run_sync(self._exited.wait, abandon_on_cancel=True)
        assert self.returncode is not None
        return self.returncode

    async def stop(self, grace: float) -> int:
        """As a process is stopped: its stdin closed; it must then exit on its own (a
        thread cannot be killed), within ``EOF_WAIT`` + ``grace``."""
        with trio.CancelScope(shield=True):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stdin.aclose()
            with trio.move_on_after(EOF_WAIT + grace):
                return await self.wait()
        # A thread cannot be killed: join() fails the test when it is still running.
        self.terminated_by_bridge = True
        return -9

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the threaded agent is still running"


def scripted(*args: str) -> AgentFunction:
    """``tests/fake_agent.py ARGS`` as an agent function: the same ``Script``, and the same
    writes (each line's answers in one write, as the process flushes them)."""

    def run(pipe: Pipe) -> int:
        parsed = fake_agent.parse_args(args)
        script = fake_agent.Script.of(parsed)
        for raw in pipe:
            out = b""
            for item in script.on_line(raw):
                if isinstance(item, fake_agent.Exit):
                    pipe.write(out)
                    return item.code
                out += item + b"\n"
            pipe.write(out)
        return int(parsed.eof_exit_code)

    return run
