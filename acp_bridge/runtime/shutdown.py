"""The end of one connection: what starts it, the order it goes in, and the exit status.

A connection ends when the client's input ends (what it sent is let through first,
:meth:`Shutdown.settle`), when the client stops reading what the bridge writes, when the
client hangs up while the client pump is stuck behind a write to an agent that does not
read, when the primary agent process exits, or on SIGINT, SIGTERM or SIGHUP. Whichever
comes first decides the exit status (:meth:`Shutdown.stop`); every agent process is then
stopped, and the last answers get a bounded time to reach the client
(:meth:`Shutdown.drain`) before the connection's tasks are cancelled.

Every wait here is on an event (the client gone, its input ended, an interception
moved, a process read to its end) under a named bound; nothing polls state an event
could report. The one timer is :data:`CLIENT_HANGUP_STALL`, which measures what no event
can: a client pump that makes no progress.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Final

import trio

from acp_bridge.runtime import early_signals, hangup
from acp_bridge.runtime.agents import Agents
from acp_bridge.runtime.connection import WRITE_FAILED, AgentConnection, Connection

log = logging.getLogger("acp_bridge")

# After the client's EOF, how long frames it sent may still wait for an interception.
CLIENT_EOF_SETTLE: Final = 5.0
# After the client closed its input, how long the client pump may go without reading before
# it counts as stuck behind a write to an agent that does not read.
CLIENT_HANGUP_STALL: Final = 0.5
# After every process is stopped, how long their last answers may take to reach the client.
FINAL_DRAIN: Final = 1.0


def exit_status(returncode: int) -> int:
    """A process status as a shell reports it: 128 + N for death by signal N."""
    return returncode if returncode >= 0 else 128 - returncode


class Shutdown:
    """How one connection ends, and with which status."""

    def __init__(
        self,
        connection: Connection,
        agents: Agents[AgentConnection],
        client_in: trio.abc.ReceiveStream,
    ) -> None:
        self.connection = connection
        self.agents = agents
        self.client_in = client_in
        self.finished = trio.Event()
        self.exit_status: int | None = None

    async def stop(self, status: Callable[[], int]) -> None:
        """Stop every agent process (stdin EOF, grace, SIGTERM, grace, SIGKILL).

        The first cause of shutdown decides the exit status; later ones only wait.
        """
        if self.agents.stopping:
            await self.finished.wait()
            return
        with trio.CancelScope(shield=True):
            await self.agents.stop_all()
            self.exit_status = status()
        self.finished.set()

    async def after_client_eof(self) -> None:
        """The client's input ended: let what it sent through, then stop."""
        await self.settle()
        await self.stop(self.status_after_client_left)

    async def settle(self) -> None:
        """Before the agent's input is closed, let what the client sent reach it.

        Frames may still wait behind an interception (a ``session/new`` pipelined behind
        ``initialize``); they are passed on first, within a bound.
        """
        connection = self.connection
        with trio.move_on_after(CLIENT_EOF_SETTLE):
            await connection.until(lambda: connection.router.settled)
            await connection.flush_client()
            for link in tuple(connection.links.values()):
                with contextlib.suppress(*WRITE_FAILED):
                    await link.outbox.settle()

    async def drain(self) -> None:
        """The processes are stopped: let their last answers reach the client.

        Each agent pump ends once it has read its process's output to the end, and every
        interception still open gets its answer (the agent's, or that it exited).
        """
        connection = self.connection
        with trio.move_on_after(FINAL_DRAIN):
            for link in tuple(connection.links.values()):
                await link.done.wait()
            await connection.until(lambda: not connection.router.intercepting)
        with trio.move_on_after(FINAL_DRAIN):
            await connection.flush_client()
            # An answer another task is still writing (it took the frames already) must
            # not be cut off by the cancellation that follows.
            with contextlib.suppress(*WRITE_FAILED):
                await connection.client_outbox.settle()

    async def watch_client_output(self) -> None:
        """A client that closed our stdout is gone even if its end of stdin stays open."""
        await self.connection.client_went_away.wait()
        await self.stop(self.status_after_client_left)

    async def watch_client_hangup(self) -> None:
        """A client that closed its input while the client pump is stuck writing to an
        agent that does not read (stopped, hung) has left too, although the pump cannot
        read up to its end of file: once the client has hung up, a pump that reads nothing
        more for :data:`CLIENT_HANGUP_STALL` is taken as stuck, and the bridge shuts down
        as for the end of file (closing the agent's input ends the blocked write)."""
        fd = hangup.descriptor_of(self.client_in)
        if fd is None or not await hangup.wait_hangup(fd):
            return
        connection = self.connection
        while not connection.client_eof.is_set():
            reads = connection.client_reads
            # Woken by the end of the client's input; otherwise the stall bound is the
            # measure of a pump that makes no progress.
            with trio.move_on_after(CLIENT_HANGUP_STALL):
                await connection.client_eof.wait()
            if connection.client_reads == reads and not connection.client_eof.is_set():
                log.info("the client left while a write to the agent was blocked")
                await self.stop(self.status_after_client_left)
                return

    async def watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            # One that came while the run started up was held for this receiver.
            held = early_signals.take()
            if held is not None:
                log.info("signal %d: shutting down", held)
                await self.stop(lambda: 128 + held)
                return
            async for signum in signals:
                log.info("signal %d: shutting down", signum)
                await self.stop(lambda: 128 + signum)  # noqa: B023
                return

    def status_after_client_left(self) -> int:
        """The agent's own status if it ended by itself on EOF, else 0: we stopped it."""
        process = self.agents.primary.process
        if process.terminated_by_bridge or process.returncode is None:
            return 0
        return exit_status(process.returncode)
