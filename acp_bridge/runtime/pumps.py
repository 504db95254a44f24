"""Reading from the peers of one connection: the client pump and one pump per agent process.

A pump reads up to :data:`READ_CHUNK` bytes, splits them into lines
(:class:`~acp_bridge.wire.framing.LineSplitter`), hands each line to the router (a run of
plain notifications as one piece, a line that arrived whole and long by its envelope
alone, the rest as a parsed :class:`~acp_bridge.wire.jsonrpc.Frame`), and has the
:class:`~acp_bridge.runtime.connection.Connection` carry out what the router returned;
then it flushes before it reads again, so a slow peer holds its pump back. A line still
arriving after ``stream_after`` bytes is passed on as it comes (:class:`LongLineWriter`)
when :class:`~acp_bridge.core.long_lines.LongLines` allows it, which decides every such
line's fate; this module only writes what it is told. An agent pump ends once its process
has exited and its output is read to the end; the end of the client's input, or of the
primary process, starts the connection's shutdown (:mod:`acp_bridge.runtime.shutdown`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from typing import Final

import trio

from acp_bridge.core.exits import describe_exit
from acp_bridge.core.long_lines import LongLine, LongLines
from acp_bridge.core.router import CLIENT, PRIMARY
from acp_bridge.runtime import pipes
from acp_bridge.runtime.agents import Agents
from acp_bridge.runtime.connection import WRITE_FAILED, AgentConnection, Connection, Outbox
from acp_bridge.runtime.handover import Replayed
from acp_bridge.runtime.shutdown import Shutdown, exit_status
from acp_bridge.runtime.trace import Tracer
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import (
    Item,
    Line,
    LineSplitter,
    LongLineEnd,
    LongLinePart,
    LongLineStart,
    OverlongLine,
)
from acp_bridge.wire.jsonrpc import Frame, FrameError

log = logging.getLogger("acp_bridge")

# Reads are this large at most; lines are reassembled by the splitter. Measured
# (bench/README.md, "Large frames"): smaller reads let a large frame's pieces overlap
# with the pipe on either side, larger ones cost fewer wake-ups; 128 KiB did best for
# 1 MiB and 16 MiB frames alike, kept a slow reader's cost flat and notifications fast.
READ_CHUNK: Final = 1 << 17
# While more client frames than these wait behind interceptions, the client is not read:
# bounded, as a pipe stops a writer its reader does not keep up with. An agent that takes
# its time over ``initialize`` would otherwise have the bridge take in all the client
# writes meanwhile, kept decoded (a small frame's about 15 times its bytes).
WAITING_CLIENT_BYTES: Final = 4 << 20
WAITING_CLIENT_FRAMES: Final = 4096
# The same bound for what an agent process sends the client that waits behind the bridge's
# answer to a request the agent has answered (spec §2): that agent is not read meanwhile,
# unless the runtime waits for an answer of its own from it (Pumps._held_back).
WAITING_AGENT_BYTES: Final = WAITING_CLIENT_BYTES
WAITING_AGENT_FRAMES: Final = WAITING_CLIENT_FRAMES
LongItem = LongLineStart | LongLinePart | LongLineEnd
# After the agent exits, how long its stdout may stay silent before it counts as closed.
# Normally EOF comes at once; only a grandchild holding the pipe makes this wait matter.
AGENT_EXIT_DRAIN: Final = 0.2


class LongLineWriter:
    """The long line in progress on one pump, written to its receiver's outbox as it
    arrives; the outbox is the line's until its end. What becomes of the line, and which
    bytes may go, :class:`~acp_bridge.core.long_lines.LongLines` decides."""

    def __init__(self, connection: Connection, long_lines: LongLines, sender: int) -> None:
        self.connection = connection
        self.long_lines = long_lines
        self.sender = sender
        self.line: LongLine | None = None
        self.outbox: Outbox | None = None
        self.writing = False  # False once the receiver is gone: judge the rest, write nothing

    async def pass_on(self, splitter: LineSplitter, item: LongItem) -> None:
        connection, long_lines = self.connection, self.long_lines
        if isinstance(item, LongLineStart):
            line = long_lines.start(self.sender, item.data, client_gone=connection.client_gone)
            if line is None:
                splitter.hold(item.data)
                return
            self.line = line
            if line.receiver == CLIENT:
                self.outbox = connection.client_outbox
            else:
                self.outbox = connection.links[line.receiver].outbox
            self.writing = True
            try:
                await self.outbox.begin_line()
            except WRITE_FAILED:
                self.writing = False
            await self._write(line.take(item.data))
            return
        line = self.line
        assert line is not None
        try:
            if isinstance(item, LongLinePart):
                await self._write(long_lines.piece(line, item.data))
                return
            last = long_lines.end(line, item.data)
        except FrameError as exc:
            self.line = None
            if isinstance(item, LongLinePart):
                splitter.discard_rest()
            await self._end(long_lines.cut(line, exc))
            connection.carry_out()
            return
        self.line = None
        connection.carry_out()
        await self._end(last)

    async def overlong(self, item: OverlongLine, limit: int) -> None:
        """A line went over the limit: cut the part passed on, if any."""
        line, self.line = self.line, None
        ending = self.long_lines.overlong(self.sender, line, item.size, limit)
        if line is not None:
            await self._end(ending)
        self.connection.carry_out()

    async def _write(self, data: bytes) -> None:
        if self.writing and data:
            assert self.outbox is not None
            try:
                await self.outbox.write_part(data)
            except WRITE_FAILED:
                self.release()

    async def _end(self, data: bytes | None) -> None:
        """Write the line's last bytes (its end, or a cut's) and newline; None: nothing."""
        if not self.writing:
            return
        if data is None:
            self.release()
            return
        assert self.outbox is not None
        with contextlib.suppress(*WRITE_FAILED):
            await self.outbox.end_line(data)
        self.writing = False

    def release(self) -> None:
        """Give the outbox back, once: it may be another line's by the time a pump ends."""
        if self.writing:
            self.writing = False
            assert self.outbox is not None
            self.outbox.abort_line()


class Pumps:
    """The pumps of one connection, and the long lines in progress on them."""

    def __init__(
        self,
        connection: Connection,
        agents: Agents[AgentConnection],
        shutdown: Shutdown,
        client_in: trio.abc.ReceiveStream,
        tracer: Tracer,
        *,
        line_limit: int,
        stream_after: int,
        grace: float,
    ) -> None:
        self.connection = connection
        self.router = connection.router
        self.long_lines = LongLines(self.router)
        self.links = connection.links
        self.agents = agents
        self.shutdown = shutdown
        self.client_in = client_in
        self.tracer = tracer
        self.tracing = tracer.enabled
        self.line_limit = line_limit
        self.stream_after = stream_after
        self.grace = grace
        # Lines this long take the validator instead of json's decoder (none while tracing:
        # the trace records decoded frames).
        self._long_after = stream_after or sys.maxsize
        if self.tracing:
            self._long_after = sys.maxsize

    # ------------------------------------------------------------ client side

    def _splitter(self) -> LineSplitter:
        # A trace records whole frames, so with one every line is gathered whole.
        stream_after = self.stream_after or None
        if self.tracing:
            stream_after = None
        return LineSplitter(self.line_limit, stream_after=stream_after)

    async def pump_client(self) -> None:
        splitter = self._splitter()
        passing = LongLineWriter(self.connection, self.long_lines, CLIENT)
        try:
            while True:
                try:
                    data = await pipes.receive_some(self.client_in, READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
                self.connection.client_reads += 1
                for item in self._lines(
                    splitter,
                    data,
                    self.router.pass_notifications_from_client,
                    self._from_client,
                    self._client_frame,
                ):
                    if isinstance(item, Line):
                        self._from_client(item.data)
                    elif isinstance(item, OverlongLine):
                        await passing.overlong(item, splitter.limit)
                    else:
                        await passing.pass_on(splitter, item)
                await self.connection.flush_all()
                if self._too_much_waits():
                    await self.connection.until(lambda: not self._too_much_waits())
                if not data:
                    self.connection.client_eof.set()
                    log.debug("client closed its input")
                    await self.shutdown.after_client_eof()
                    return
        finally:
            passing.release()

    def _too_much_waits(self) -> bool:
        gate = self.router.gate
        return gate.waiting > WAITING_CLIENT_FRAMES or gate.waiting_bytes > WAITING_CLIENT_BYTES

    def _lines(
        self,
        splitter: LineSplitter,
        data: bytes | bytearray,
        pass_notifications: Callable[[list[bytes], int], tuple[int, Frame | None]],
        receive_line: Callable[[bytes], None],
        receive_frame: Callable[[Frame], None],
    ) -> list[Item]:
        """The lines of one read (at the end of the stream, the last one), for the pump to
        hand on one by one; none if the read took the fast path.

        The fast path, for a read of short lines (the usual read of a busy stream): the
        router passes each run of plain notifications on as one piece, as the bytes came
        (``pass_notifications``); the line after a run goes to ``receive_frame`` if reading
        the run parsed it, else to ``receive_line``, in order. Not while tracing: the trace
        records frame by frame.
        """
        if not data:
            return splitter.close()
        lines = None if self.tracing else splitter.feed_short(data)
        if lines is None:
            return splitter.feed(data)
        if b"" in lines:
            # Blank lines carry nothing and get no answer: dropped in one pass in C, a read
            # of them costs no Python step per line.
            lines = list(filter(None, lines))
        index, count = 0, len(lines)
        while index < count:
            start = index
            index, frame = pass_notifications(lines, index)
            if index > start:
                self.connection.carry_out()
            if index < count:
                if frame is None:
                    receive_line(lines[index])
                else:
                    receive_frame(frame)
                index += 1
        return []

    def _client_frame(self, frame: Frame) -> None:
        self.connection.carry_out(self.router.receive_from_client(frame))

    def _from_client(self, raw: bytes) -> None:
        if not raw or raw.isspace():
            return  # a blank line: nothing to answer (isspace stops at the first other byte)
        long = len(raw) >= self._long_after
        if long:
            hop = self.long_lines.whole(CLIENT, raw)
            self.connection.carry_out()
            if hop is not None:
                self.connection.queue(hop, raw)
                return
        try:
            frame = jsonrpc.parse(raw)
        except FrameError as exc:
            if self.tracer.enabled:
                self.tracer.record("client->bridge", raw, None)
            hop = self.long_lines.unparsed(CLIENT, raw, exc, tried_whole=long)
            self.connection.carry_out()
            if hop is not None:
                self.connection.queue(hop, raw)
            return
        if self.tracing:
            self.tracer.record("client->bridge", raw, frame.message)
        self.connection.carry_out(self.router.receive_from_client(frame))

    # ------------------------------------------------------------- agent side

    async def pump_agent(self, link: AgentConnection) -> None:
        async with trio.open_nursery() as nursery:
            # The agent's stdout ends at EOF, or shortly after the agent exits: a grandchild
            # that inherited the pipe (npx and similar wrappers) may hold it open for ever.
            exited = trio.Event()
            read_scope: list[trio.CancelScope] = []
            nursery.start_soon(self._watch_agent_exit, link, exited, read_scope)
            await self._read_agent(link, exited, read_scope)
            nursery.cancel_scope.cancel()
        await self._agent_gone(link)

    async def _watch_agent_exit(
        self, link: AgentConnection, exited: trio.Event, read_scope: list[trio.CancelScope]
    ) -> None:
        await link.process.wait()
        exited.set()
        self.connection.moved()  # a pump held back reads what it left
        for scope in read_scope:
            # Whatever the agent wrote before exiting is already in the pipe.
            scope.deadline = trio.current_time() + AGENT_EXIT_DRAIN

    async def _read_agent(
        self, link: AgentConnection, exited: trio.Event, read_scope: list[trio.CancelScope]
    ) -> None:
        passing = LongLineWriter(self.connection, self.long_lines, link.hop)
        try:
            await self._read_agent_lines(link, exited, read_scope, passing)
        finally:
            passing.release()

    async def _read_agent_lines(
        self,
        link: AgentConnection,
        exited: trio.Event,
        read_scope: list[trio.CancelScope],
        passing: LongLineWriter,
    ) -> None:
        splitter = self._splitter()
        stream = link.process.stdout
        from_agent = functools.partial(self._from_agent, link)
        agent_frame = functools.partial(self._agent_frame, link)
        while True:
            if isinstance(stream, Replayed) and stream.replayed:
                stream = stream.inner  # the early exchange is behind: the pipe itself
            data = await self._read_agent_output(stream, exited, read_scope)
            for item in self._lines(
                splitter,
                data,
                self.router.pass_notifications_from_agent,
                from_agent,
                agent_frame,
            ):
                if isinstance(item, Line):
                    self._from_agent(link, item.data)
                elif isinstance(item, OverlongLine):
                    await passing.overlong(item, splitter.limit)
                else:
                    await passing.pass_on(splitter, item)
            # An agent pump writes only to the client.
            await self.connection.flush_client()
            if not data:
                break
            if self._held_back(link.hop, exited):
                await self.connection.until(lambda: not self._held_back(link.hop, exited))

    def _held_back(self, hop: int, exited: trio.Event) -> bool:
        """Whether agent process ``hop`` is read no further for now: more of what it sent
        the client waits behind the bridge's answer to a request it answered than the
        bound, and nothing the runtime waits for can come from it (an answer to a request
        of the bridge's own, which an adapter's hook may need before that answer goes;
        the output it leaves when it exits)."""
        frames, size = self.router.answer_hold.held(hop)
        if frames <= WAITING_AGENT_FRAMES and size <= WAITING_AGENT_BYTES:
            return False
        return not exited.is_set() and not self.router.hops[hop].pending.awaited()

    @staticmethod
    async def _read_agent_output(
        stream: trio.abc.ReceiveStream, exited: trio.Event, read_scope: list[trio.CancelScope]
    ) -> bytes | bytearray:
        """The agent's next output; b"" at its end, or once it has exited and its output
        stays silent for :data:`AGENT_EXIT_DRAIN`. Only the wait is cancelled, never a
        frame half-written to the client; output already waiting is read without one."""
        try:
            data = await pipes.receive_ready(stream, READ_CHUNK)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return b""
        if data is not None:
            return data
        with trio.CancelScope() as scope:
            if exited.is_set():
                scope.deadline = trio.current_time() + AGENT_EXIT_DRAIN
            else:
                read_scope[:] = [scope]
            try:
                return await pipes.receive_some(stream, READ_CHUNK, empty=True)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return b""
            finally:
                read_scope.clear()
        return b""  # the wait was cancelled: the agent exited and its output stayed silent

    def _agent_frame(self, link: AgentConnection, frame: Frame) -> None:
        self.connection.carry_out(self.router.receive_from_agent(link.hop, frame))

    def _from_agent(self, link: AgentConnection, raw: bytes) -> None:
        if not raw or raw.isspace():
            return
        long = len(raw) >= self._long_after
        if long:
            peer = self.long_lines.whole(link.hop, raw)
            self.connection.carry_out()
            if peer is not None:
                self.connection.queue(peer, raw)
                return
        try:
            frame = jsonrpc.parse(raw)
        except FrameError as exc:
            peer = self.long_lines.unparsed(link.hop, raw, exc, tried_whole=long)
            self.connection.carry_out()
            if peer is not None:
                if self.tracing:
                    self.tracer.record(f"{link.name}->bridge", raw, None)
                self.connection.queue(peer, raw)
            return
        if self.tracing:
            self.tracer.record(f"{link.name}->bridge", raw, frame.message)
        self.connection.carry_out(self.router.receive_from_agent(link.hop, frame))

    async def _agent_gone(self, link: AgentConnection) -> None:
        with trio.move_on_after(self.grace):
            link.exit_status = await link.process.wait()
        # Also for a process that exited by itself: stop() ends what is left of its group,
        # closes its stdin and releases its watchdog (a no-op if it was stopped already).
        status = await link.process.stop(self.grace)
        if link.exit_status is None:
            link.exit_status = status
        await self._release(link)
        # An agent the bridge itself stopped (it ignored EOF, as codex-acp does) is no news.
        expected = link.exit_status == 0 or link.process.terminated_by_bridge
        log.log(
            logging.INFO if expected else logging.WARNING,
            "%s: %s",
            link.name,
            describe_exit(link.exit_status),
        )
        link.closed = True
        self.connection.carry_out(self.router.hop_closed(link.hop, link.exit_status))
        await self.connection.flush_client()
        link.done.set()
        if link.hop == PRIMARY:
            status = exit_status(link.exit_status)
            await self.shutdown.stop(lambda: status)

    async def _release(self, link: AgentConnection) -> None:
        """The pump has read all a gone process wrote: close its stdout, and forget it, so a
        long-lived bridge holds nothing for the pooled processes it saw come and go."""
        with trio.CancelScope(shield=True), contextlib.suppress(*WRITE_FAILED):
            await link.process.stdout.aclose()
        self.agents.forget(link.process)
