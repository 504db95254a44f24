"""Replaying the early ``initialize`` exchange through the runtime.

:mod:`acp_bridge.runtime.early_initialize` may have read from and written to both peers before
the runtime loaded. The runtime does not take that over as state: it runs the connection
from the start, on streams that hand its pumps the bytes already read (in the order they
were read, so the router sees the ``initialize`` request before the agent's answer) and
that check that its first writes are exactly the bytes already written, without writing
them again. The router, the adapter, the session store and the trace so see the same
frames as without the early exchange, and a difference would be logged as an error.
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from acp_bridge.runtime import pipes
from acp_bridge.runtime.early_initialize import Exchange
from acp_bridge.supervision.agent_process import AgentProcess

log = logging.getLogger("acp_bridge")

# Bytes replayed behind a write still to be repeated wait at most this long: the write
# comes as soon as the runtime has handled the bytes before them.
REPLAY_WAIT: Final = 5.0


class AlreadyWritten(trio.abc.SendStream):
    """``inner``, whose first ``written`` bytes reached the peer already."""

    def __init__(
        self, inner: trio.abc.SendStream, written: bytes, peer: str, done: trio.Event
    ) -> None:
        self.inner = inner
        self.pending = written
        self.peer = peer
        self.done = done
        if not written:
            done.set()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.pending:
            count = min(len(self.pending), len(data))
            if bytes(data[:count]) == self.pending[:count]:
                self.pending = self.pending[count:]
                data = data[count:]
            else:
                log.error(
                    "the early answer to initialize differs from the bridge's: the %s got %r",
                    self.peer,
                    self.pending[:200],
                )
                self.pending = b""
            if not self.pending:
                self.done.set()
        if data:
            await pipes.send_all(self.inner, data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        self.done.set()  # nothing more is written: nothing waits for it
        await self.inner.aclose()


class Replayed(trio.abc.ReceiveStream):
    """``inner``, after the chunks already read from it, each once its gates are set."""

    def __init__(
        self, inner: trio.abc.ReceiveStream, chunks: list[tuple[bytes, tuple[trio.Event, ...]]]
    ) -> None:
        self.inner = inner
        self.chunks = [(data, gates) for data, gates in chunks if data]
        # What is read from the peer itself comes after every chunk: it was not read yet
        # when the exchange ended, so it follows all of it.
        self.gates = tuple(gate for _, gates in chunks for gate in gates)

    @property
    def replayed(self) -> bool:
        """Whether everything was replayed: from then on it reads ``inner`` as it is."""
        return not self.chunks and not self.gates

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.chunks:
            data, gates = self.chunks[0]
            await _wait(gates)
            size = len(data) if max_bytes is None else max_bytes
            if size < len(data):
                self.chunks[0] = (data[size:], gates)
                return data[:size]
            self.chunks.pop(0)
            return data
        if self.gates:
            await _wait(self.gates)
            self.gates = ()
        if max_bytes is None:
            return await self.inner.receive_some()
        return await pipes.receive_some(self.inner, max_bytes)

    async def aclose(self) -> None:
        self.chunks.clear()
        await self.inner.aclose()


async def _wait(gates: tuple[trio.Event, ...]) -> None:
    # Shielded: the agent pump's read is cancelled shortly after the agent exits, and
    # bytes the agent wrote before exiting must still be replayed, not lost.
    with trio.CancelScope(shield=True), trio.move_on_after(REPLAY_WAIT):
        for gate in gates:
            await gate.wait()


class Replay:
    """The streams of one connection, wrapped to replay ``exchange``."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.forwarded = trio.Event()
        """Set once the runtime has written ``to_agent`` again."""
        self.answered = trio.Event()
        """Set once the runtime has written ``to_client`` again."""
        if not exchange.to_agent:
            self.forwarded.set()
        if not exchange.to_client:
            self.answered.set()

    def agent(self, process: AgentProcess) -> None:
        """Wrap the pipes of the agent the exchange talked to."""
        exchange = self.exchange
        process.stdin = AlreadyWritten(process.stdin, exchange.to_agent, "agent", self.forwarded)
        process.stdout = Replayed(
            process.stdout,
            [
                (exchange.agent_first, (self.forwarded,)),
                (exchange.agent_rest, (self.forwarded, self.answered)),
            ],
        )

    def client(
        self, client_in: trio.abc.ReceiveStream, client_out: trio.abc.SendStream
    ) -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream]:
        """The client's streams, wrapped."""
        exchange = self.exchange
        replayed = Replayed(
            client_in,
            [
                (exchange.client_first, ()),
                (exchange.client_rest, (self.forwarded, self.answered)),
            ],
        )
        return replayed, AlreadyWritten(client_out, exchange.to_client, "client", self.answered)
