"""The trio runtime around the protocol core: one client connection and its agent processes.

:class:`Bridge` wires the runtime's parts together and runs them in one nursery. This
module also owns the pumps that read lines from each peer and the order of shutdown.
Where a frame goes, under which id and when is decided by
:class:`~acp_bridge.core.router.Router`; the runtime only carries it out.

Writes are batched: a pump queues every frame one read produced and writes them with one
flush before it reads again (so a slow peer still holds the pump back); everything else the
bridge writes to a peer goes through the same outbox, so nothing overtakes.

The other parts, each in its own module: the outboxes and what the router's calls return
(:mod:`~acp_bridge.runtime.connection`), the intercepted requests and the adapter
(:mod:`~acp_bridge.runtime.interception`), and the agent processes and what an adapter is
lent (:mod:`~acp_bridge.runtime.agents`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from acp_bridge.adapter import Adapter
from acp_bridge.core.exits import describe_exit
from acp_bridge.core.router import CLIENT, PRIMARY, Router
from acp_bridge.core.sessions import SessionTable
from acp_bridge.core.system_prompt import DEFAULT_MAX_PROMPT_BYTES
from acp_bridge.registry import AUTO, AdapterRegistry
from acp_bridge.runtime import hangup

# AgentHandle, Spawner and spawn_process are re-exported: tests and embedders name them
# through the relay, as they name AgentConnection, Call and Outbox.
from acp_bridge.runtime.agents import AgentHandle as AgentHandle  # noqa: PLC0414
from acp_bridge.runtime.agents import Agents
from acp_bridge.runtime.agents import Spawner as Spawner  # noqa: PLC0414
from acp_bridge.runtime.agents import spawn_process as spawn_process  # noqa: PLC0414
from acp_bridge.runtime.connection import WRITE_FAILED, Connection, Outbox
from acp_bridge.runtime.connection import AgentConnection as AgentConnection  # noqa: PLC0414
from acp_bridge.runtime.interception import Call as Call  # noqa: PLC0414
from acp_bridge.runtime.interception import Interceptions
from acp_bridge.runtime.refusal import refuse_requests
from acp_bridge.runtime.trace import Tracer
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.supervision.agent_process import AgentStartError
from acp_bridge.wire import json_stream, jsonrpc
from acp_bridge.wire.framing import (
    DEFAULT_LINE_LIMIT,
    DEFAULT_STREAM_AFTER,
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

# After the client's EOF, how long frames it sent may still wait for an interception.
CLIENT_EOF_SETTLE: Final = 5.0
# After the client closed its input, how long the client pump may go without reading before
# it counts as stuck behind a write to an agent that does not read.
CLIENT_HANGUP_STALL: Final = 0.5
# After every process is stopped, how long their last answers may take to reach the client.
FINAL_DRAIN: Final = 1.0
# Answered to a command that cannot be started, as a shell does.
START_FAILED_STATUS: Final = 127


@dataclass(frozen=True)
class BridgeOptions:
    agent_argv: Sequence[str]
    agent_env: dict[str, str] = field(default_factory=dict)
    adapter: str = AUTO
    on_omitted: str = "keep"
    allow_override: bool = True
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    line_limit: int = DEFAULT_LINE_LIMIT
    # A line still arriving after this many bytes is passed on as it comes, if the router
    # allows it (see LongLine), instead of being gathered whole first; 0: never.
    stream_after: int = DEFAULT_STREAM_AFTER
    shutdown_grace: float = 2.0
    # Per-adapter settings (``bridge.adapter_options.<adapter>``), read by the adapter.
    adapter_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


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


def exit_status(returncode: int) -> int:
    """A process status as a shell reports it: 128 + N for death by signal N."""
    return returncode if returncode >= 0 else 128 - returncode


class Bridge:
    """One client connection relayed to its agent process(es)."""

    def __init__(
        self,
        options: BridgeOptions,
        client_in: trio.abc.ReceiveStream,
        client_out: trio.abc.SendStream,
        lifecycle: Lifecycle,
        *,
        registry: AdapterRegistry | None = None,
        tracer: Tracer | None = None,
        spawner: Spawner = spawn_process,
    ) -> None:
        self.options = options
        self.client_in = client_in
        self.tracer = tracer or Tracer(None)
        self._tracing = self.tracer.enabled
        # Lines this long take the validator instead of json's decoder (none while tracing:
        # the trace records decoded frames).
        self._long_after = options.stream_after or sys.maxsize
        if self._tracing:
            self._long_after = sys.maxsize
        self.lifecycle = lifecycle
        self.router = Router()
        self.agents: Agents[AgentConnection] = Agents(
            options.agent_argv,
            options.agent_env,
            grace=options.shutdown_grace,
            spawner=spawner,
            attach=self._attach_later,
            replayed=self._replayed,
        )
        self.links = self.agents.links
        # Every process this connection started, attached or not: shutdown stops them all.
        self.processes = self.agents.processes
        self.connection = Connection(
            self.router, client_out, self.links, self.tracer, intercept=self._intercept
        )
        self.interceptions = Interceptions(
            self.connection,
            self.agents,
            lifecycle,
            SessionTable(
                lifecycle.agent,
                on_omitted=options.on_omitted,
                max_prompt_bytes=options.max_prompt_bytes,
            ),
            registry=registry or AdapterRegistry(),
            tracer=self.tracer,
            adapter=options.adapter,
            allow_override=options.allow_override,
            adapter_options=options.adapter_options,
            start_soon=self.start_soon,
        )
        self._nursery: trio.Nursery | None = None
        self._exit_status: int | None = None
        self._finished = trio.Event()

    @property
    def adapter(self) -> Adapter | None:
        """The adapter, once the agent has answered ``initialize``."""
        return self.interceptions.adapter

    def _intercept(self, token: int, frame: Frame) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self.interceptions.run, token, frame)

    # ----------------------------------------------------------------- running

    def adopt(self, process: AgentHandle) -> None:
        """Run with an agent process started before the bridge (see ``cli.run``)."""
        self.agents.adopt(process)

    async def start_agent(self) -> None:
        """Start the primary agent process; raises AgentStartError if it cannot start."""
        await self.agents.start_primary()

    async def run(self, *, watch_signals: bool = True) -> int:
        """Relay until the client leaves, the agent exits or a signal arrives; the exit status."""
        if self.agents.primary_process is None:
            try:
                await self.start_agent()
            except AgentStartError as exc:
                return await self._refuse_client(exc)
        primary = self.agents.primary_process
        assert primary is not None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._attach(primary, PRIMARY, "agent")
                if watch_signals:
                    nursery.start_soon(self._watch_signals)
                nursery.start_soon(self._pump_client)
                nursery.start_soon(self._watch_client_output)
                nursery.start_soon(self._watch_client_hangup)
                await self._finished.wait()
                await self._drain()
                nursery.cancel_scope.cancel()
        finally:
            # Cancelled from outside (a server closing, an early Ctrl-C): still no process
            # is left behind.
            if not self._finished.is_set():
                await self._shutdown(lambda: 0)
        if self.adapter is not None:
            with trio.CancelScope(shield=True):
                await self.adapter.aclose()
        return self._exit_status if self._exit_status is not None else 0

    async def _drain(self) -> None:
        """The processes are stopped: let their last answers reach the client.

        Each agent pump ends once it has read its process's output to the end, and every
        interception still open gets its answer (the agent's, or that it exited).
        """
        with trio.move_on_after(FINAL_DRAIN):
            for link in tuple(self.links.values()):
                await link.done.wait()
            await self.connection.until(lambda: not self.router.intercepting)
        with trio.move_on_after(FINAL_DRAIN):
            await self.connection.flush_client()
            # An answer another task is still writing (it took the frames already) must
            # not be cut off by the cancellation that follows.
            with contextlib.suppress(*WRITE_FAILED):
                await self.connection.client_outbox.settle()

    async def _refuse_client(self, failure: AgentStartError) -> int:
        """The agent cannot start: answer the client's requests with why, until it leaves.

        The client's ``initialize`` gets the error (naming the command and the cause), so
        an editor shows it instead of a bare end of stream.
        """
        log.error("%s", failure)
        # Only argv[0] is named: the arguments may hold prompt text.
        await refuse_requests(
            self.client_in,
            self.connection.client_outbox.stream,
            failure.error_object(),
            line_limit=self.options.line_limit,
            wait=self.options.shutdown_grace + 3,
        )
        return START_FAILED_STATUS

    def _attach(self, process: AgentHandle, hop: int, name: str) -> AgentConnection:
        assert self._nursery is not None
        link = AgentConnection(self.connection, process, hop, name)
        self.links[hop] = link
        self._nursery.start_soon(self._pump_agent, link)
        return link

    def _attach_later(self, process: AgentHandle) -> AgentConnection:
        hop = self.router.add_hop()
        return self._attach(process, hop, f"agent-{hop}")

    def _replayed(self) -> list[tuple[str, Any]]:
        """What a process started after the first gets before it is used."""
        replayed: list[tuple[str, Any]] = []
        initialize_params = self.interceptions.initialize_params
        if initialize_params is not None:
            replayed.append(("initialize", initialize_params))
        if self.router.authenticate_params is not None:
            replayed.append(("authenticate", self.router.authenticate_params))
        return replayed

    async def spawn_agent(
        self,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        private_files: Sequence[str] = (),
    ) -> AgentConnection:
        """Start another process of the agent and replay the client's initialize to it."""
        return await self.agents.spawn(extra_args, extra_env, private_files)

    @property
    def primary(self) -> AgentConnection:
        """The agent process started first; it answers everything not routed elsewhere."""
        return self.agents.primary

    def start_soon(self, async_fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run background work of an adapter for as long as the connection lives."""
        assert self._nursery is not None
        self._nursery.start_soon(async_fn, *args)

    async def _shutdown(self, status: Callable[[], int]) -> None:
        """Stop every agent process (stdin EOF, grace, SIGTERM, grace, SIGKILL).

        The first cause of shutdown decides the exit status; later ones only wait.
        """
        if self.agents.stopping:
            await self._finished.wait()
            return
        with trio.CancelScope(shield=True):
            await self.agents.stop_all()
            self._exit_status = status()
        self._finished.set()

    async def _watch_client_output(self) -> None:
        """A client that closed our stdout is gone even if its end of stdin stays open."""
        await self.connection.client_went_away.wait()
        await self._shutdown(self._status_after_client_left)

    async def _watch_client_hangup(self) -> None:
        """A client that closed its input while the client pump is stuck writing to an
        agent that does not read (stopped, hung) has left too, although the pump cannot
        read up to its end of file: once the client has hung up, a pump that reads nothing
        more for :data:`CLIENT_HANGUP_STALL` is taken as stuck, and the bridge shuts down
        as for the end of file (closing the agent's input ends the blocked write)."""
        fd = hangup.descriptor_of(self.client_in)
        if fd is None or not await hangup.wait_hangup(fd):
            return
        while not self.connection.client_eof.is_set():
            reads = self.connection.client_reads
            with trio.move_on_after(CLIENT_HANGUP_STALL):
                await self.connection.client_eof.wait()
            if self.connection.client_reads == reads and not self.connection.client_eof.is_set():
                log.info("the client left while a write to the agent was blocked")
                await self._shutdown(self._status_after_client_left)
                return

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                log.info("signal %d: shutting down", signum)
                await self._shutdown(lambda: 128 + signum)  # noqa: B023
                return

    def _status_after_client_left(self) -> int:
        """The agent's own status if it ended by itself on EOF, else 0: we stopped it."""
        process = self.primary.process
        if process.terminated_by_bridge or process.returncode is None:
            return 0
        return exit_status(process.returncode)

    # ------------------------------------------------------------ client side

    def _splitter(self) -> LineSplitter:
        # A trace records whole frames, so with one every line is gathered whole.
        stream_after = self.options.stream_after or None
        if self._tracing:
            stream_after = None
        return LineSplitter(self.options.line_limit, stream_after=stream_after)

    async def _pump_client(self) -> None:
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
                    await self._settle()
                    await self._shutdown(self._status_after_client_left)
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
        lines = None if self._tracing else splitter.feed_short(data)
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

    async def _settle(self) -> None:
        """Before the agent's input is closed, let what the client sent reach it.

        Frames may still wait behind an interception (a ``session/new`` pipelined behind
        ``initialize``); they are passed on first, within a bound.
        """
        with trio.move_on_after(CLIENT_EOF_SETTLE):
            await self.connection.until(lambda: self.router.settled)
            await self.connection.flush_client()
            for link in tuple(self.links.values()):
                with contextlib.suppress(*WRITE_FAILED):
                    await link.outbox.settle()

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
        if self._tracing:
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

    # ------------------------------------------------------------- agent side

    async def _pump_agent(self, link: AgentConnection) -> None:
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
        if self._tracing:
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
                if self._tracing:
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
        with trio.move_on_after(self.options.shutdown_grace):
            link.exit_status = await link.process.wait()
        # Also for a process that exited by itself: stop() ends what is left of its group,
        # closes its stdin and releases its watchdog (a no-op if it was stopped already).
        status = await link.process.stop(self.options.shutdown_grace)
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
            await self._shutdown(lambda: status)

    async def _release(self, link: AgentConnection) -> None:
        """The pump has read all a gone process wrote: close its stdout, and forget it, so a
        long-lived bridge holds nothing for the pooled processes it saw come and go."""
        with trio.CancelScope(shield=True), contextlib.suppress(*WRITE_FAILED):
            await link.process.stdout.aclose()
        self.agents.forget(link.process)
