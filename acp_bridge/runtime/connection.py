"""What one client connection sends, and the answers its tasks wait for.

:class:`Connection` is the router's runtime side: after every call into
:class:`~acp_bridge.core.router.Router` it takes the bytes the router queued for each peer
and puts them in that peer's :class:`Outbox` (one per peer, so nothing overtakes), and
carries out the events the call returned — an interception to start, an answer for a
task that waits (:class:`Waiter`), a process gone before it answered. It also owns the
client's side of the connection's state that more than one task reads: whether the
client went away, how far it was read, whether its input ended.

:class:`AgentConnection` is one agent process as adapters see it (``AgentLink``): its
outbox, its hop in the router, requests and notifications of the bridge's own.

Reading from the peers is :mod:`acp_bridge.runtime.pumps`' job; the processes themselves
are :mod:`acp_bridge.runtime.agents`'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

import trio

from acp_bridge.adapter import AgentError, AgentExited
from acp_bridge.core.router import CLIENT, NO_EVENTS, Abandoned, Answered, Event, Intercept, Router
from acp_bridge.runtime import pipes
from acp_bridge.runtime.agents import AgentHandle
from acp_bridge.runtime.trace import Tracer
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import join_lines
from acp_bridge.wire.jsonrpc import Frame, JsonObject

log = logging.getLogger("acp_bridge")

WRITE_FAILED: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class Outbox:
    """The frames on their way to one peer, written in the order they were queued."""

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self.stream = stream
        self.frames: list[bytes] = []
        # One writer at a time; the frames are taken only while holding it, so the order
        # of writes is the order of queueing.
        self._lock = trio.Lock()
        self.in_line = False  # a long line is being passed on: nothing may come between

    async def begin_line(self) -> None:
        """Start passing on a long line: what was queued before it goes first, then the
        outbox is the caller's until :meth:`end_line` (or :meth:`abort_line`)."""
        await self._lock.acquire()
        self.in_line = True
        try:
            await self._write_queued()
        except BaseException:
            self.abort_line()
            raise

    async def write_part(self, data: bytes) -> None:
        if data:
            await pipes.send_all(self.stream, data)

    async def end_line(self, data: bytes) -> None:
        """Write the line's last bytes and its newline, then what was queued meanwhile."""
        try:
            await self._write_queued(data)
        finally:
            self.abort_line()

    def abort_line(self) -> None:
        """Give the outbox back (after :meth:`end_line`, or when the writer is gone)."""
        if self.in_line:
            self.in_line = False
            self._lock.release()

    async def flush(self) -> None:
        """Write the queued frames; with nothing queued return at once, even while another
        task writes (a pump must never wait for a write it did not ask for). While a long
        line is being passed on, frames wait for its end (:meth:`end_line` writes them)."""
        if not self.frames or self.in_line:
            return
        try:
            self._lock.acquire_nowait()  # the usual case, without a trip to the scheduler
        except trio.WouldBlock:
            await self._lock.acquire()
        try:
            await self._write_queued()
        finally:
            self._lock.release()

    async def _write_queued(self, line_end: bytes | None = None) -> None:
        """Write the queued frames (after ``line_end``, the rest of a line passed on), as
        newline-terminated lines in as few writes as :func:`join_lines` makes them."""
        frames, self.frames = self.frames, []
        if line_end is not None:
            frames.insert(0, line_end)
        for buffer in join_lines(frames):
            await pipes.send_all(self.stream, buffer)

    async def settle(self) -> None:
        """Flush, and wait for a write another task has in progress."""
        await self.flush()
        async with self._lock:
            pass


class Waiter:
    """One answer a task waits for: an agent's response, or the news that it is gone."""

    __slots__ = ("_done", "answer")

    def __init__(self) -> None:
        self._done = trio.Event()
        self.answer: Frame | AgentExited | None = None

    def set(self, answer: Frame | AgentExited) -> None:
        self.answer = answer
        self._done.set()

    async def wait(self) -> Frame | AgentExited:
        await self._done.wait()
        assert self.answer is not None
        return self.answer


class AgentConnection:
    """One agent process as adapters see it (implements ``AgentLink``)."""

    def __init__(self, connection: Connection, process: AgentHandle, hop: int, name: str) -> None:
        self.connection = connection
        self.process = process
        self.hop = hop
        self.name = name
        self.initialize_result: JsonObject | None = None
        self.exit_status: int | None = None
        self.closed = False
        self.done = trio.Event()
        self.outbox = Outbox(process.stdin)

    async def flush(self) -> None:
        try:
            await self.outbox.flush()
        except WRITE_FAILED:
            log.debug("%s: write failed; the agent is gone", self.name)

    async def wait_closed(self) -> None:
        """Return once the process has exited and what it wrote last reached the client."""
        await self.done.wait()

    async def request(self, method: str, params: JsonObject) -> Any:
        """A request of the bridge's own: its result, or AgentError / AgentExited."""
        connection = self.connection
        waiter = connection.router.request(self.hop, method, params)
        connection.carry_out()
        answer = await connection.wait_for(waiter, self)
        if isinstance(answer, AgentExited):
            raise answer
        if "error" in answer.message:
            raise AgentError(answer.message["error"])
        return answer.message.get("result")

    async def notify(self, method: str, params: JsonObject) -> None:
        self.connection.router.notify(self.hop, method, params)
        self.connection.carry_out()
        await self.flush()


class Connection:
    """The router's output and events carried out for one client connection."""

    def __init__(
        self,
        router: Router,
        client_out: trio.abc.SendStream,
        links: Mapping[int, AgentConnection],
        tracer: Tracer,
        *,
        intercept: Callable[[int, Frame], None],
    ) -> None:
        self.router = router
        self.links = links
        self.tracer = tracer
        self.tracing = tracer.enabled
        self.client_outbox = Outbox(client_out)
        # Starts a task for an intercepted request (the router's Intercept event).
        self._intercept = intercept
        self._waiters: dict[int, Waiter] = {}
        # Set (and replaced) each time an interception is forwarded or answered, the only
        # steps after which the router can have become settled or stopped intercepting;
        # and when the runtime starts waiting for an agent's answer, or an agent exits,
        # after which an agent pump held back behind an answer reads on
        # (Pumps._held_back). What waits in until() looks again.
        self._moved = trio.Event()
        self.client_gone = False
        self.client_went_away = trio.Event()
        # How far the client pump has read, for telling a pump stuck behind a blocked
        # write from one still reading (see Shutdown.watch_client_hangup).
        self.client_reads = 0
        self.client_eof = trio.Event()

    def queue(self, peer: int, raw: bytes) -> None:
        """Put ``raw`` in ``peer``'s outbox, after everything queued for it before."""
        if peer == CLIENT:
            if not self.client_gone:
                if self.tracing:
                    self.tracer.record("agent->client", raw, None)
                self.client_outbox.frames.append(raw)
            return
        link = self.links[peer]
        if self.tracing:
            self.tracer.record(f"bridge->{link.name}", raw, None)
        link.outbox.frames.append(raw)

    def carry_out(self, events: list[Event] = NO_EVENTS) -> None:
        """Carry out what the router asked for: queue the bytes it has for each peer in that
        peer's outbox (in order, so nothing overtakes), then the ``events`` the call
        returned. Called after every call into the router."""
        for send in self.router.data_to_send():
            self.queue(send.peer, send.raw)
        later = self.router.events_since()
        for event in [*events, *later] if later else events:
            if isinstance(event, Intercept):
                self._intercept(event.token, event.frame)
            elif isinstance(event, Answered):
                self._waiters.pop(event.waiter).set(event.frame)
            elif isinstance(event, Abandoned):
                self._waiters.pop(event.waiter).set(AgentExited(event.status))

    def answer_client_error(self, request_id: jsonrpc.RequestId, code: int, message: str) -> None:
        self.queue(CLIENT, jsonrpc.encode(jsonrpc.error_response(request_id, code, message)))

    def moved(self) -> None:
        """An interception was forwarded or answered, the runtime began waiting for an
        agent's answer, or an agent exited: wake what waits in :meth:`until`."""
        self._moved.set()
        self._moved = trio.Event()

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition`` (of the router's interceptions and what the runtime waits
        for) holds."""
        while not condition():
            await self._moved.wait()

    async def wait_for(self, waiter_id: int | None, link: AgentConnection) -> Frame | AgentExited:
        """The answer the router will hand to ``waiter_id`` (None: ``link`` is gone).

        What waits in :meth:`until` looks again first: the request may be an interception
        just forwarded, and its answer may be behind what a held-back pump left."""
        self.moved()
        if waiter_id is None:
            return AgentExited(link.exit_status)
        waiter = self._waiters[waiter_id] = Waiter()
        await self.flush_all()
        return await waiter.wait()

    async def flush_client(self) -> None:
        try:
            await self.client_outbox.flush()
        except WRITE_FAILED:
            if not self.client_gone:
                self.client_gone = True
                self.client_outbox.frames.clear()
                self.client_went_away.set()
                log.info("the client went away")

    async def flush_all(self) -> None:
        # Most outboxes are empty at any flush (one process of a pool gets the request):
        # those are passed over here rather than asked.
        if self.client_outbox.frames:
            await self.flush_client()
        for link in tuple(self.links.values()):
            if link.outbox.frames:
                await link.flush()
