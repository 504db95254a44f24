"""Reading from the peers of one connection: the client pump and one pump per agent process.

A pump reads up to :data:`READ_CHUNK` bytes, splits them into lines
(:class:`~acp_bridge.wire.framing.LineSplitter`), hands each line to the router (a run of
plain notifications as one piece, a line that arrived whole and long by its envelope
alone, the rest as a parsed :class:`~acp_bridge.wire.jsonrpc.Frame`), and has the
:class:`~acp_bridge.runtime.connection.Connection` carry out what the router returned;
then it flushes before it reads again, so a slow peer holds its pump back. A line still
arriving after ``stream_after`` bytes is passed on as it comes (:class:`LongLine`) when the
router allows it. An agent pump ends once its process has exited and its output is read
to the end; the end of the client's input, or of the primary process, starts the
connection's shutdown (:mod:`acp_bridge.runtime.shutdown`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio

from acp_bridge.core.exits import describe_exit
from acp_bridge.core.router import CLIENT, PRIMARY
from acp_bridge.runtime.agents import Agents
from acp_bridge.runtime.connection import WRITE_FAILED, AgentConnection, Connection, Outbox
from acp_bridge.runtime.shutdown import Shutdown, exit_status
from acp_bridge.runtime.trace import Tracer
from acp_bridge.wire import json_stream, jsonrpc
from acp_bridge.wire.framing import (
    Item,
    Line,
    LineSplitter,
    LongLineEnd,
    LongLinePart,
    LongLineStart,
    OverlongLine,
)
from acp_bridge.wire.json_stream import Envelope, LineValidator
from acp_bridge.wire.jsonrpc import Frame, FrameError

log = logging.getLogger("acp_bridge")

# Reads are this large at most; lines are reassembled by the splitter. Measured
# (bench/README.md, "Large frames"): smaller reads let a large frame's pieces overlap
# with the pipe on either side, larger ones cost fewer wake-ups; 128 KiB did best for
# 1 MiB and 16 MiB frames alike, kept a slow reader's cost flat and notifications fast.
READ_CHUNK: Final = 1 << 17
LongItem = LongLineStart | LongLinePart | LongLineEnd
# After the agent exits, how long its stdout may stay silent before it counts as closed.
# Normally EOF comes at once; only a grandchild holding the pipe makes this wait matter.
AGENT_EXIT_DRAIN: Final = 0.2


@dataclass(slots=True)
class LongLine:
    """A line passed on while it is still arriving (spec §2 with a bounded memory).

    Its bytes go to ``outbox`` as they come, but only once ``validator`` has judged them
    (:meth:`take`): what was released is always the start of a valid JSON text, and the
    few bytes after it (a character, an escape or a literal cut by the end of a read) wait
    for the next piece. Only a valid line gets its end. One that turns out not to be valid
    JSON-RPC, or goes over the line limit, is cut (:meth:`cut`): what was released is
    ended as one valid message its receiver ignores (``LineValidator.cut_ending``), and the
    sender gets the error it would have had for the whole line.
    """

    validator: LineValidator
    outbox: Outbox
    hop: int
    writing: bool = True  # False once the receiver is gone: judge the rest, write nothing
    held: bytes = b""  # taken but not judged yet: not released
    released: int = 0
    ending: bytes | None = None  # ends what was released, should the line be cut

    async def take(self, data: bytes) -> None:
        """Bytes the validator has taken without fault: release those it has judged."""
        judged = self.validator.judged
        count = judged - self.released
        if self.held:
            data = self.held + data
        piece = data if count == len(data) else data[:count]
        self.held = b"" if count == len(data) else data[count:]
        self.released = judged
        if piece:
            # Computed now, while the validator's state is that of the released bytes.
            self.ending = self.validator.cut_ending()
            await self.write(piece)

    async def write(self, data: bytes) -> None:
        if self.writing:
            try:
                await self.outbox.write_part(data)
            except WRITE_FAILED:
                self.stop_writing()

    async def end(self, data: bytes) -> None:
        """The line is valid and recorded: its last bytes (with those held) and newline."""
        if self.writing:
            with contextlib.suppress(*WRITE_FAILED):
                await self.outbox.end_line(self.held + data)
            self.writing = False

    async def cut(self) -> None:
        """End the line short as a message the receiver ignores (nothing if nothing went)."""
        if not self.writing:
            return
        if not self.released:
            self.stop_writing()
            return
        ending = self.ending
        if ending is None:  # not expected: a line is passed only once it names its kind
            log.error("a long line was cut where it cannot be ended as JSON")
            ending = b""
        with contextlib.suppress(*WRITE_FAILED):
            await self.outbox.end_line(ending)
        self.writing = False

    def stop_writing(self) -> None:
        """Give the outbox back, once: it may be another line's by the time a pump ends."""
        if self.writing:
            self.writing = False
            self.outbox.abort_line()


@dataclass(slots=True)
class LongLineRoute:
    """What differs between the two directions a long line passes in, and the line in
    progress on one pump (see ``Bridge._pass_long_line``)."""

    open: Callable[[Envelope], tuple[Outbox, int] | None]
    """Where a line with this start may go as it arrives (its outbox and hop), or None."""
    record: Callable[[LongLine, Envelope], bool]
    """The router records the complete line; False: it cannot go on unchanged after all."""
    cut: Callable[[LongLine, FrameError], None]
    """Tell whoever must know that the line was cut."""
    current: LongLine | None = None

    async def abandon(self) -> LongLine | None:
        """Cut the line in progress short (it went over the limit); the line, if any."""
        line, self.current = self.current, None
        if line is not None:
            await line.cut()
        return line

    def release(self) -> None:
        """The pump is ending: give back the outbox a line in progress holds."""
        if self.current is not None:
            self.current.stop_writing()


def _request_id(line: LongLine) -> jsonrpc.RequestId:
    """The id to answer a cut line with: its own if it is a request that named one."""
    return line.validator.envelope.request_id()


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
        route = LongLineRoute(
            self._open_client_line, self._record_client_line, self._cut_client_line
        )
        try:
            while True:
                try:
                    data = await self.client_in.receive_some(READ_CHUNK)
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
                        cut = await route.abandon()
                        self.connection.answer_client_error(
                            None if cut is None else _request_id(cut),
                            jsonrpc.INVALID_REQUEST,
                            f"The message is {item.size} bytes, more than the line limit "
                            f"of {splitter.limit} bytes.",
                        )
                    else:
                        await self._pass_long_line(splitter, route, item)
                await self.connection.flush_all()
                if not data:
                    self.connection.client_eof.set()
                    log.debug("client closed its input")
                    await self.shutdown.after_client_eof()
                    return
        finally:
            route.release()

    def _open_client_line(self, envelope: Envelope) -> tuple[Outbox, int] | None:
        hop = self.router.stream_from_client(envelope)
        return None if hop is None else (self.links[hop].outbox, hop)

    def _record_client_line(self, line: LongLine, envelope: Envelope) -> bool:
        recorded = self.router.stream_ended_from_client(line.hop, envelope)
        self.connection.carry_out()
        return recorded

    def _cut_client_line(self, line: LongLine, error: FrameError) -> None:
        log.warning("cut a long line from the client: %s", error.message)
        self.connection.answer_client_error(_request_id(line), error.code, error.message)

    async def _pass_long_line(
        self, splitter: LineSplitter, route: LongLineRoute, item: LongItem
    ) -> None:
        """Pass on a long line as it arrives, in either direction (``route``)."""
        if isinstance(item, LongLineStart):
            validator = LineValidator()
            try:
                validator.feed(item.data)
                target = route.open(validator.envelope)
            except FrameError:
                target = None
            if target is None:
                splitter.hold(item.data)
                return
            started = route.current = LongLine(validator, *target)
            try:
                await started.outbox.begin_line()
            except WRITE_FAILED:
                started.writing = False
            await started.take(item.data)
            return
        line = route.current
        assert line is not None
        try:
            line.validator.feed(item.data)
            if isinstance(item, LongLinePart):
                await line.take(item.data)
                return
            if not route.record(line, line.validator.finish()):
                raise FrameError(
                    jsonrpc.INVALID_REQUEST,
                    "The bridge could not pass the message on as it came: a member after its "
                    "large one changes how it must be routed.",
                )
        except FrameError as exc:
            route.current = None
            await line.cut()
            if isinstance(item, LongLinePart):
                splitter.discard_rest()
            route.cut(line, exc)
            return
        route.current = None
        await line.end(item.data)

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

    @staticmethod
    def _whole_long_line(raw: bytes) -> Envelope | None:
        """A long line that arrived in one piece (see ``_long_after``), judged by the
        validator, which does not build its value: its envelope, or None to parse it the
        usual way."""
        validator = LineValidator()
        try:
            validator.feed(raw)
            return validator.finish()
        except FrameError:
            return None  # the usual way says why

    def _from_client(self, raw: bytes) -> None:
        if not raw or raw.isspace():
            return  # a blank line: nothing to answer (isspace stops at the first other byte)
        envelope = self._whole_long_line(raw) if len(raw) >= self._long_after else None
        if envelope is not None:
            hop = self.router.pass_whole_from_client(envelope)
            self.connection.carry_out()
            if hop is not None:
                self.connection.queue(hop, raw)
                return
        try:
            frame = jsonrpc.parse(raw)
        except FrameError as exc:
            if self.tracer.enabled:
                self.tracer.record("client->bridge", raw, None)
            self._unparsed_from_client(raw, exc, tried_whole=envelope is not None)
            return
        if self.tracing:
            self.tracer.record("client->bridge", raw, frame.message)
        self.connection.carry_out(self.router.receive_from_client(frame))

    def _unparsed_from_client(self, raw: bytes, error: FrameError, *, tried_whole: bool) -> None:
        """A client line json's decoder did not read. Judged again without building it:
        valid JSON nested too deeply to build goes on if the router passes it unchanged
        (whatever its length, as a long line does); everything else is answered, with the
        request's id whenever the line named one before its fault or limit."""
        envelope, fault = json_stream.judge(raw)
        if fault is not None:
            error = fault
        elif isinstance(error, jsonrpc.NestedTooDeeply):
            hop = None if tried_whole else self.router.pass_whole_from_client(envelope)
            self.connection.carry_out()
            if hop is not None:
                self.connection.queue(hop, raw)
                return
            error = FrameError(error.code, error.message, envelope.request_id())
        self.connection.answer_client_error(error.request_id, error.code, error.message)

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
        for scope in read_scope:
            # Whatever the agent wrote before exiting is already in the pipe.
            scope.deadline = trio.current_time() + AGENT_EXIT_DRAIN

    async def _read_agent(
        self, link: AgentConnection, exited: trio.Event, read_scope: list[trio.CancelScope]
    ) -> None:
        route = LongLineRoute(
            functools.partial(self._open_agent_line, link),
            functools.partial(self._record_agent_line, link),
            functools.partial(self._cut_agent_line, link),
        )
        try:
            await self._read_agent_lines(link, exited, read_scope, route)
        finally:
            route.release()

    async def _read_agent_lines(
        self,
        link: AgentConnection,
        exited: trio.Event,
        read_scope: list[trio.CancelScope],
        route: LongLineRoute,
    ) -> None:
        splitter = self._splitter()
        stream = link.process.stdout
        from_agent = functools.partial(self._from_agent, link)
        agent_frame = functools.partial(self._agent_frame, link)
        while True:
            data: bytes | bytearray = b""
            # Only the read is cancelled, never a frame half-written to the client.
            with trio.CancelScope() as scope:
                if exited.is_set():
                    scope.deadline = trio.current_time() + AGENT_EXIT_DRAIN
                else:
                    read_scope[:] = [scope]
                try:
                    data = await stream.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
            read_scope.clear()
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
                    if (cut := await route.abandon()) is not None:
                        self.router.agent_line_refused(link.hop, cut.validator.envelope)
                        self.connection.carry_out()
                    log.warning(
                        "%s: dropped a %d-byte line over the line limit", link.name, item.size
                    )
                else:
                    await self._pass_long_line(splitter, route, item)
            # An agent pump writes only to the client.
            await self.connection.flush_client()
            if not data:
                break

    def _open_agent_line(
        self, link: AgentConnection, envelope: Envelope
    ) -> tuple[Outbox, int] | None:
        if self.connection.client_gone or not self.router.stream_from_agent(link.hop, envelope):
            return None
        return self.connection.client_outbox, CLIENT

    def _record_agent_line(
        self, link: AgentConnection, _line: LongLine, envelope: Envelope
    ) -> bool:
        recorded = self.router.stream_ended_from_agent(link.hop, envelope)
        self.connection.carry_out()
        return recorded

    def _cut_agent_line(self, link: AgentConnection, line: LongLine, error: FrameError) -> None:
        log.warning("%s: cut a long line that is not JSON-RPC: %s", link.name, error.message)
        self.router.agent_line_refused(link.hop, line.validator.envelope)
        self.connection.carry_out()

    def _agent_frame(self, link: AgentConnection, frame: Frame) -> None:
        self.connection.carry_out(self.router.receive_from_agent(link.hop, frame))

    def _from_agent(self, link: AgentConnection, raw: bytes) -> None:
        if not raw or raw.isspace():
            return
        envelope = self._whole_long_line(raw) if len(raw) >= self._long_after else None
        passed = envelope is not None and self.router.pass_whole_from_agent(link.hop, envelope)
        self.connection.carry_out()
        if passed:
            self.connection.queue(CLIENT, raw)
            return
        try:
            frame = jsonrpc.parse(raw)
        except FrameError as exc:
            self._unparsed_from_agent(link, raw, exc, tried_whole=envelope is not None)
            return
        if self.tracing:
            self.tracer.record(f"{link.name}->bridge", raw, frame.message)
        self.connection.carry_out(self.router.receive_from_agent(link.hop, frame))

    def _unparsed_from_agent(
        self, link: AgentConnection, raw: bytes, error: FrameError, *, tried_whole: bool
    ) -> None:
        """An agent line json's decoder did not read: the same rule as for the client's
        (:meth:`_unparsed_from_client`), but what does not go on is dropped with a log
        line, and the client is told if it was the answer to its request."""
        envelope, fault = json_stream.judge(raw)
        if fault is None and isinstance(error, jsonrpc.NestedTooDeeply):
            passed = not tried_whole and self.router.pass_whole_from_agent(link.hop, envelope)
            self.connection.carry_out()
            if passed:
                if self.tracing:
                    self.tracer.record(f"{link.name}->bridge", raw, None)
                self.connection.queue(CLIENT, raw)
                return
            log.warning("%s: dropped a line: %s", link.name, error.message)
            self.router.agent_line_refused(link.hop, envelope, error.message)
            self.connection.carry_out()
            return
        preview = raw[:200].decode(errors="replace")
        reason = (fault or error).message
        log.warning("%s: dropped a line that is not JSON-RPC (%s): %s", link.name, reason, preview)
        self.router.agent_line_refused(link.hop, envelope)
        self.connection.carry_out()

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
