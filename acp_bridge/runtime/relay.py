"""The trio runtime around the protocol core: one client connection and its agent processes.

This module owns what takes time: the pumps that read lines from each peer, the outboxes
that write to them, one task per intercepted request (the adapter's hook runs there), the
session store called off the event loop, and the order of shutdown. Where a frame goes,
under which id and when is decided by :class:`~acp_bridge.core.router.Router`; this module
only carries it out.

Writes are batched: a pump queues every frame one read produced and writes them with one
flush before it reads again (so a slow peer still holds the pump back); everything else the
bridge writes to a peer goes through the same outbox, so nothing overtakes.

Starting, replaying to and stopping agent processes, and what an adapter is lent, are
:mod:`acp_bridge.runtime.agents`' job; this module pumps what they write.
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

from acp_bridge.adapter import (
    HOOKS,
    Adapter,
    AgentError,
    AgentExited,
    AgentLink,
    Reply,
)
from acp_bridge.core import capabilities
from acp_bridge.core.exits import describe_exit
from acp_bridge.core.router import (
    CLIENT,
    NO_EVENTS,
    PRIMARY,
    Abandoned,
    Answered,
    Event,
    Intercept,
    Router,
)
from acp_bridge.core.sessions import SessionTable, Step, Withdraw
from acp_bridge.core.system_prompt import (
    DEFAULT_MAX_PROMPT_BYTES,
    PromptRejected,
    SystemPrompt,
)
from acp_bridge.registry import AUTO, AdapterRegistry
from acp_bridge.runtime import hangup

# AgentHandle, Spawner and spawn_process are re-exported: tests and embedders name them
# through the relay.
from acp_bridge.runtime.agents import AgentHandle as AgentHandle  # noqa: PLC0414
from acp_bridge.runtime.agents import Agents, LentContext
from acp_bridge.runtime.agents import Spawner as Spawner  # noqa: PLC0414
from acp_bridge.runtime.agents import spawn_process as spawn_process  # noqa: PLC0414
from acp_bridge.runtime.refusal import refuse_requests
from acp_bridge.runtime.trace import Tracer
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import StoreError
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
    join_lines,
)
from acp_bridge.wire.json_stream import Envelope, LineValidator
from acp_bridge.wire.jsonrpc import Frame, FrameError, JsonObject

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
WRITE_FAILED: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
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
            await self.stream.send_all(data)

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
            await self.stream.send_all(buffer)

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


class AgentConnection:
    """One agent process as adapters see it (implements ``AgentLink``)."""

    def __init__(self, bridge: Bridge, process: AgentHandle, hop: int, name: str) -> None:
        self.bridge = bridge
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
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            log.debug("%s: write failed; the agent is gone", self.name)

    async def wait_closed(self) -> None:
        """Return once the process has exited and what it wrote last reached the client."""
        await self.done.wait()

    async def request(self, method: str, params: JsonObject) -> Any:
        """A request of the bridge's own: its result, or AgentError / AgentExited."""
        waiter = self.bridge.router.request(self.hop, method, params)
        self.bridge.carry_out()
        answer = await self.bridge.wait_for(waiter, self)
        if isinstance(answer, AgentExited):
            raise answer
        if "error" in answer.message:
            raise AgentError(answer.message["error"])
        return answer.message.get("result")

    async def notify(self, method: str, params: JsonObject) -> None:
        self.bridge.router.notify(self.hop, method, params)
        self.bridge.carry_out()
        await self.flush()


class Call:
    """An intercepted client request on its way through an adapter hook (``LifecycleCall``).

    What it runs with (prompt, previous, delivered, the params to forward) is the session
    table's :class:`~acp_bridge.core.sessions.Step`; ``initialize`` has none.
    """

    def __init__(
        self,
        bridge: Bridge,
        token: int,
        frame: Frame,
        link: AgentConnection,
        step: Step | None = None,
    ) -> None:
        self.bridge = bridge
        self.token = token
        self.frame = frame
        self.method: str = frame.method or ""
        self.link = link
        self.original_params: JsonObject = frame.params
        self.params: JsonObject = dict(frame.params if step is None else step.params)
        self.prompt: SystemPrompt | None = None if step is None else step.prompt
        self.previous: SystemPrompt | None = None if step is None else step.previous
        self.session_id: str | None = None if step is None else step.session_id
        self.client_sent_prompt = False if step is None else step.client_sent_prompt
        self.delivered: str | None = None if step is None else step.delivered
        self.delivered_now: str | None = None
        self.forwarded_to: AgentConnection | None = None

    async def forward(self, link: AgentLink | None = None) -> Reply:
        if link is None:
            target = self.link
        elif isinstance(link, AgentConnection) and link.bridge is self.bridge:
            target = link
        else:
            raise TypeError(f"call.forward() got a link this bridge did not make: {link!r}")
        self.forwarded_to = target
        unchanged = self.params == self.original_params
        message = None if unchanged else {**self.frame.message, "params": self.params}
        waiter, events = self.bridge.router.forward(self.token, target.hop, message)
        self.bridge.carry_out(events)
        self.bridge.interception_moved()
        answer = await self.bridge.wait_for(waiter, target)
        if isinstance(answer, AgentExited):
            return Reply.internal(str(answer), {"exitStatus": answer.status})
        body = answer.message
        raw = answer.raw if body.get("id") == self.frame.id else None
        return Reply(result=body.get("result"), error=body.get("error"), frame_bytes=raw)

    def mark_delivered(self, fingerprint: str | None) -> None:
        self.delivered_now = fingerprint


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
        self.client_outbox = Outbox(client_out)
        self.client_gone = False
        self.lifecycle = lifecycle
        self.registry = registry or AdapterRegistry()
        self.router = Router()
        self.adapter: Adapter | None = None
        self.sessions = SessionTable(
            lifecycle.agent,
            on_omitted=options.on_omitted,
            max_prompt_bytes=options.max_prompt_bytes,
        )
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
        self.initialize_params: Any = None
        self.log = log
        self._waiters: dict[int, Waiter] = {}
        self._nursery: trio.Nursery | None = None
        self._exit_status: int | None = None
        self._finished = trio.Event()
        self._client_went_away = trio.Event()
        # How far the client pump has read, for telling a pump stuck behind a blocked
        # write from one still reading (see _watch_client_hangup).
        self._client_reads = 0
        self._client_eof = trio.Event()
        # Set (and replaced) each time an interception is forwarded or answered: the only
        # steps after which the router can have become settled or stopped intercepting.
        self._interception_moved = trio.Event()

    # ------------------------------------------------------------------ wiring

    def _queue(self, peer: int, raw: bytes) -> None:
        if peer == CLIENT:
            if not self.client_gone:
                if self._tracing:
                    self.tracer.record("agent->client", raw, None)
                self.client_outbox.frames.append(raw)
            return
        link = self.links[peer]
        if self._tracing:
            self.tracer.record(f"bridge->{link.name}", raw, None)
        link.outbox.frames.append(raw)

    def carry_out(self, events: list[Event] = NO_EVENTS) -> None:
        """Carry out what the router asked for: queue the bytes it has for each peer in that
        peer's outbox (in order, so nothing overtakes), then the ``events`` the call
        returned. Called after every call into the router."""
        for send in self.router.data_to_send():
            self._queue(send.peer, send.raw)
        for event in events:
            if isinstance(event, Intercept):
                assert self._nursery is not None
                self._nursery.start_soon(self._intercept, event.token, event.frame)
            elif isinstance(event, Answered):
                self._waiters.pop(event.waiter).set(event.frame)
            elif isinstance(event, Abandoned):
                self._waiters.pop(event.waiter).set(AgentExited(event.status))

    def interception_moved(self) -> None:
        """An interception was forwarded or answered: wake what waits in :meth:`_until`."""
        self._interception_moved.set()
        self._interception_moved = trio.Event()

    async def _until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition`` (of the router's interceptions) holds."""
        while not condition():
            await self._interception_moved.wait()

    async def wait_for(self, waiter_id: int | None, link: AgentConnection) -> Frame | AgentExited:
        if waiter_id is None:
            return AgentExited(link.exit_status)
        waiter = self._waiters[waiter_id] = Waiter()
        await self.flush_all()
        return await waiter.wait()

    async def flush_client(self) -> None:
        try:
            await self.client_outbox.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            if not self.client_gone:
                self.client_gone = True
                self.client_outbox.frames.clear()
                self._client_went_away.set()
                log.info("the client went away")

    async def flush_all(self) -> None:
        await self.flush_client()
        for link in tuple(self.links.values()):
            await link.flush()

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
            await self._until(lambda: not self.router.intercepting)
        with trio.move_on_after(FINAL_DRAIN):
            await self.flush_client()
            # An answer another task is still writing (it took the frames already) must
            # not be cut off by the cancellation that follows.
            with contextlib.suppress(*WRITE_FAILED):
                await self.client_outbox.settle()

    async def _refuse_client(self, failure: AgentStartError) -> int:
        """The agent cannot start: answer the client's requests with why, until it leaves.

        The client's ``initialize`` gets the error (naming the command and the cause), so
        an editor shows it instead of a bare end of stream.
        """
        log.error("%s", failure)
        # Only argv[0] is named: the arguments may hold prompt text.
        await refuse_requests(
            self.client_in,
            self.client_outbox.stream,
            failure.error_object(),
            line_limit=self.options.line_limit,
            wait=self.options.shutdown_grace + 3,
        )
        return START_FAILED_STATUS

    def _attach(self, process: AgentHandle, hop: int, name: str) -> AgentConnection:
        assert self._nursery is not None
        link = AgentConnection(self, process, hop, name)
        self.links[hop] = link
        self._nursery.start_soon(self._pump_agent, link)
        return link

    def _attach_later(self, process: AgentHandle) -> AgentConnection:
        hop = self.router.add_hop()
        return self._attach(process, hop, f"agent-{hop}")

    def _replayed(self) -> list[tuple[str, Any]]:
        """What a process started after the first gets before it is used."""
        replayed: list[tuple[str, Any]] = []
        if self.initialize_params is not None:
            replayed.append(("initialize", self.initialize_params))
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
        await self._client_went_away.wait()
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
        while not self._client_eof.is_set():
            reads = self._client_reads
            with trio.move_on_after(CLIENT_HANGUP_STALL):
                await self._client_eof.wait()
            if self._client_reads == reads and not self._client_eof.is_set():
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
                self._client_reads += 1
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
                        self._answer_client_error(
                            None if cut is None else _request_id(cut),
                            jsonrpc.INVALID_REQUEST,
                            f"The message is {item.size} bytes, more than the line limit "
                            f"of {splitter.limit} bytes.",
                        )
                    else:
                        await self._pass_long_line(splitter, route, item)
                await self.flush_all()
                if not data:
                    self._client_eof.set()
                    log.debug("client closed its input")
                    await self._settle()
                    await self._shutdown(self._status_after_client_left)
                    return
        finally:
            route.release()

    def _answer_client_error(self, request_id: jsonrpc.RequestId, code: int, message: str) -> None:
        self._queue(CLIENT, jsonrpc.encode(jsonrpc.error_response(request_id, code, message)))

    def _open_client_line(self, envelope: Envelope) -> tuple[Outbox, int] | None:
        hop = self.router.stream_from_client(envelope)
        return None if hop is None else (self.links[hop].outbox, hop)

    def _record_client_line(self, line: LongLine, envelope: Envelope) -> bool:
        recorded = self.router.stream_ended_from_client(line.hop, envelope)
        self.carry_out()
        return recorded

    def _cut_client_line(self, line: LongLine, error: FrameError) -> None:
        log.warning("cut a long line from the client: %s", error.message)
        self._answer_client_error(_request_id(line), error.code, error.message)

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
                self.carry_out()
            if index < count:
                if frame is None:
                    receive_line(lines[index])
                else:
                    receive_frame(frame)
                index += 1
        return []

    def _client_frame(self, frame: Frame) -> None:
        self.carry_out(self.router.receive_from_client(frame))

    async def _settle(self) -> None:
        """Before the agent's input is closed, let what the client sent reach it.

        Frames may still wait behind an interception (a ``session/new`` pipelined behind
        ``initialize``); they are passed on first, within a bound.
        """
        with trio.move_on_after(CLIENT_EOF_SETTLE):
            await self._until(lambda: self.router.settled)
            await self.flush_client()
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
            self.carry_out()
            if hop is not None:
                self._queue(hop, raw)
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
        self.carry_out(self.router.receive_from_client(frame))

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
            self.carry_out()
            if hop is not None:
                self._queue(hop, raw)
                return
            error = FrameError(error.code, error.message, envelope.request_id())
        self._answer_client_error(error.request_id, error.code, error.message)

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
                        self.carry_out()
                    log.warning(
                        "%s: dropped a %d-byte line over the line limit", link.name, item.size
                    )
                else:
                    await self._pass_long_line(splitter, route, item)
            # An agent pump writes only to the client.
            await self.flush_client()
            if not data:
                break

    def _open_agent_line(
        self, link: AgentConnection, envelope: Envelope
    ) -> tuple[Outbox, int] | None:
        if self.client_gone or not self.router.stream_from_agent(link.hop, envelope):
            return None
        return self.client_outbox, CLIENT

    def _record_agent_line(
        self, link: AgentConnection, _line: LongLine, envelope: Envelope
    ) -> bool:
        recorded = self.router.stream_ended_from_agent(link.hop, envelope)
        self.carry_out()
        return recorded

    def _cut_agent_line(self, link: AgentConnection, line: LongLine, error: FrameError) -> None:
        log.warning("%s: cut a long line that is not JSON-RPC: %s", link.name, error.message)
        self.router.agent_line_refused(link.hop, line.validator.envelope)
        self.carry_out()

    def _agent_frame(self, link: AgentConnection, frame: Frame) -> None:
        self.carry_out(self.router.receive_from_agent(link.hop, frame))

    def _from_agent(self, link: AgentConnection, raw: bytes) -> None:
        if not raw or raw.isspace():
            return
        envelope = self._whole_long_line(raw) if len(raw) >= self._long_after else None
        passed = envelope is not None and self.router.pass_whole_from_agent(link.hop, envelope)
        self.carry_out()
        if passed:
            self._queue(CLIENT, raw)
            return
        try:
            frame = jsonrpc.parse(raw)
        except FrameError as exc:
            self._unparsed_from_agent(link, raw, exc, tried_whole=envelope is not None)
            return
        if self._tracing:
            self.tracer.record(f"{link.name}->bridge", raw, frame.message)
        self.carry_out(self.router.receive_from_agent(link.hop, frame))

    def _unparsed_from_agent(
        self, link: AgentConnection, raw: bytes, error: FrameError, *, tried_whole: bool
    ) -> None:
        """An agent line json's decoder did not read: the same rule as for the client's
        (:meth:`_unparsed_from_client`), but what does not go on is dropped with a log
        line, and the client is told if it was the answer to its request."""
        envelope, fault = json_stream.judge(raw)
        if fault is None and isinstance(error, jsonrpc.NestedTooDeeply):
            passed = not tried_whole and self.router.pass_whole_from_agent(link.hop, envelope)
            self.carry_out()
            if passed:
                if self._tracing:
                    self.tracer.record(f"{link.name}->bridge", raw, None)
                self._queue(CLIENT, raw)
                return
            log.warning("%s: dropped a line: %s", link.name, error.message)
            self.router.agent_line_refused(link.hop, envelope, error.message)
            self.carry_out()
            return
        preview = raw[:200].decode(errors="replace")
        reason = (fault or error).message
        log.warning("%s: dropped a line that is not JSON-RPC (%s): %s", link.name, reason, preview)
        self.router.agent_line_refused(link.hop, envelope)
        self.carry_out()

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
        self.carry_out(self.router.hop_closed(link.hop, link.exit_status))
        await self.flush_client()
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

    # ------------------------------------------------------- intercepted calls

    async def _intercept(self, token: int, frame: Frame) -> None:
        try:
            reply = await self._handle(token, frame)
        except Exception as exc:
            log.exception("handling %s failed", frame.method)
            reply = Reply.internal(f"The bridge failed to handle {frame.method}.", str(exc))
        self.carry_out(self.router.answer(token, self._encode_reply(frame, reply)))
        self.interception_moved()
        await self.flush_all()

    @staticmethod
    def _encode_reply(frame: Frame, reply: Reply) -> bytes:
        if reply.frame_bytes is not None:
            return reply.frame_bytes
        if reply.error is not None:
            return jsonrpc.encode(jsonrpc.error_answer(frame.id, reply.error))
        return jsonrpc.encode(jsonrpc.result_response(frame.id, reply.result))

    def _route_link(self, frame: Frame) -> AgentConnection:
        return self.links[self.router.hop_for(frame.message)]

    async def _handle(self, token: int, frame: Frame) -> Reply:
        link = self._route_link(frame)
        if frame.method == "initialize":
            return await self._initialize(Call(self, token, frame, link))
        assert self.adapter is not None
        method = frame.method or ""
        # What the named session (for fork: the parent) has been running with.
        named = self.sessions.reads(method, frame.params)
        stored = None if named is None else await self._store(self.lifecycle.get, named)
        try:
            step = self.sessions.begin(method, frame.params, stored)
        except PromptRejected as rejected:
            return Reply(error=rejected.error())
        call = Call(self, token, frame, link, step)
        hook = getattr(self.adapter, HOOKS[call.method])
        reply: Reply = await hook(call)
        return await self._record(call, step, reply)

    async def _initialize(self, call: Call) -> Reply:
        self.initialize_params = call.frame.params
        reply = await call.forward()
        result = reply.result
        if not reply.ok or not isinstance(result, dict):
            return reply
        self.primary.initialize_result = result
        if self.adapter is None:
            self._choose_adapter(result)
        assert self.adapter is not None
        # Each adapter names the wire forms it puts the prompt in, for the trace to hide.
        self.tracer.redactor = self.adapter.redact
        delivery, advertised = capabilities.initialize_answer(
            self.adapter, result, allow_override=self.options.allow_override
        )
        self.router.configure(
            intercepted=self.sessions.initialized(
                result, delivery, intercepts_prompt=self.adapter.intercepts_prompt
            )
        )
        self.lifecycle.agent = self.sessions.agent
        log.info("adapter %s; delivery %s", self.adapter.name, delivery)
        if advertised is None:
            return reply
        return reply.with_result(advertised)

    def _choose_adapter(self, initialize_result: JsonObject) -> None:
        if self.options.adapter == AUTO:
            adapter_class = self.registry.choose(initialize_result)
        else:
            adapter_class = self.registry.get(self.options.adapter)
        self.adapter = adapter_class(
            LentContext(
                self.agents,
                live=lambda: self.sessions.live,
                place=self.router.place,
                unplace=self.router.unplace,
                start_soon=self.start_soon,
                adapter_options=self.options.adapter_options,
                log=log,
            )
        )

    async def _store(self, operation: Callable[..., Any], *args: Any) -> Any:
        """A call into the session store: off the event loop when it may wait on another
        process's lock, in place for an in-memory store (a thread would only add latency)."""
        if not self.lifecycle.store.may_wait:
            return operation(*args)
        return await trio.to_thread.run_sync(operation, *args)

    async def _record(self, call: Call, step: Step, reply: Reply) -> Reply:
        """Store what the session table says the answer changed; if that fails, no session
        the agent opened for this request may be left open."""
        outcome = self.sessions.answered(
            step, result=reply.result, error=reply.error, delivered_now=call.delivered_now
        )
        if outcome.writes:
            try:
                await self._store(self.lifecycle.apply, *outcome.writes)
            except StoreError as exc:
                log.error("%s: %s", call.method, exc)
                link = call.forwarded_to or call.link
                failed = self.sessions.record_failed(
                    outcome, str(exc), link.initialize_result or {}
                )
                if failed.withdraw is not None:
                    await self._withdraw(link, failed.withdraw)
                return Reply(error=failed.error)
        self.sessions.recorded(outcome)
        return reply

    async def _withdraw(self, link: AgentConnection, withdraw: Withdraw) -> None:
        """End a session the agent opened for a request whose recording then failed."""
        for method in withdraw.methods:
            try:
                await link.request(method, withdraw.params)
                return
            except AgentExited:
                return  # the session went with the process
            except AgentError as exc:
                if withdraw.done(exc.error):
                    return
                log.warning("%s of session %s failed: %s", method, withdraw.session_id, exc)
        if withdraw.methods:
            log.warning("session %s stays open in the agent", withdraw.session_id)
        else:
            log.warning(
                "session %s stays open in the agent: it offers neither session/close "
                "nor session/delete",
                withdraw.session_id,
            )
