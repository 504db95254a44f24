"""The relay: one client connection, one or more agent processes, and everything in between.

This module owns the trio side of the bridge: the pumps that read lines from each peer,
the pending-request tables of both directions, the id translation that keeps the bridge's
own requests (and several agent processes) from colliding with ids in flight, and the
shutdown sequence. Frames nobody needs to change travel as the bytes they arrived as.

Writes are batched: a pump queues every frame one read produced and writes them with one
flush before it reads again (so a slow peer still holds the pump back); everything else
the bridge writes is queued behind them and flushed at once, so nothing overtakes.

Id rules (spec §2): a peer's id is kept as it is unless it is already in flight on the
connection it goes to; only then is it replaced by a fresh ``acp-bridge-N`` id, and the
replacement is undone on the response and applied to ``$/cancel_request``.
"""

from __future__ import annotations

import copy
import itertools
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from acp_bridge import capabilities, jsonrpc
from acp_bridge.adapter import (
    Adapter,
    AgentError,
    AgentExited,
    AgentLink,
    Delivery,
    Reply,
    describe_exit,
)
from acp_bridge.agent_process import AgentProcess
from acp_bridge.framing import DEFAULT_LINE_LIMIT, Line, LineSplitter, join_lines
from acp_bridge.jsonrpc import (
    CANCEL_REQUEST,
    Frame,
    FrameError,
    JsonObject,
    Kind,
    RequestId,
    is_request_id,
)
from acp_bridge.lifecycle import Lifecycle
from acp_bridge.registry import AUTO, AdapterRegistry
from acp_bridge.system_prompt import (
    DEFAULT_MAX_PROMPT_BYTES,
    PromptRejected,
    SystemPrompt,
    parse_system_prompt,
)
from acp_bridge.trace import Tracer

log = logging.getLogger("acp_bridge")

# Reads are this large at most; lines are reassembled by the splitter.
READ_CHUNK: Final = 1 << 20
# After the agent exits, how long its stdout may stay silent before it counts as closed.
# Normally EOF comes at once; only a grandchild holding the pipe makes this wait matter.
AGENT_EXIT_DRAIN: Final = 0.2

HOOKS: Final = {
    "session/new": "session_new",
    "session/load": "session_load",
    "session/resume": "session_resume",
    "session/fork": "session_fork",
    "session/close": "session_close",
    "session/delete": "session_delete",
    "session/prompt": "session_prompt",
}
LIFECYCLE: Final = frozenset({"session/new", "session/load", "session/resume", "session/fork"})


@dataclass(frozen=True)
class BridgeOptions:
    agent_argv: Sequence[str]
    agent_env: dict[str, str] = field(default_factory=dict)
    adapter: str = AUTO
    on_omitted: str = "keep"
    allow_override: bool = True
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    line_limit: int = DEFAULT_LINE_LIMIT
    shutdown_grace: float = 2.0
    # Per-adapter settings (``bridge.adapter_options.<adapter>``), read by the adapter.
    adapter_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class Forwarded:
    """A client request in flight on an agent connection."""

    client_id: RequestId
    method: str | None
    waiter: trio.MemorySendChannel[Frame | AgentExited] | None = None


class Outbox:
    """The frames on their way to one peer, written in the order they were queued.

    Everything the bridge sends to a peer goes through its one outbox, so frames relayed
    untouched and frames the bridge writes itself cannot overtake each other.
    """

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self.stream = stream
        self._frames: list[bytes] = []
        # One writer at a time; the frames are taken only while holding it, so the order
        # of writes is the order of queueing.
        self._lock = trio.Lock()

    def queue(self, raw: bytes) -> None:
        self._frames.append(raw)

    async def flush(self) -> None:
        """Write the queued frames; when it returns they are written or being written.

        With nothing queued it returns at once, even while another task writes: a pump
        must never wait for a write it did not ask for. Stream errors propagate and the
        frames taken are dropped.
        """
        if not self._frames:
            return
        try:
            self._lock.acquire_nowait()  # the usual case, without a trip to the scheduler
        except trio.WouldBlock:
            await self._lock.acquire()
        try:
            frames, self._frames = self._frames, []
            for buffer in join_lines(frames):
                await self.stream.send_all(buffer)
        finally:
            self._lock.release()


class ClientSide:
    """Writes to the client: nothing but ACP frames."""

    def __init__(self, stream: trio.abc.SendStream, tracer: Tracer) -> None:
        self.outbox = Outbox(stream)
        self.tracer = tracer
        self.gone = False
        self.went_away = trio.Event()  # set when a write fails: nobody reads our stdout

    def queue_raw(self, raw: bytes, message: Any = None) -> None:
        if self.gone:
            return
        self.tracer.record("agent->client", raw, message)
        self.outbox.queue(raw)

    def queue(self, message: JsonObject) -> None:
        self.queue_raw(jsonrpc.encode(message), message)

    async def flush(self) -> None:
        try:
            await self.outbox.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            if not self.gone:
                self.gone = True
                self.went_away.set()
                log.info("the client went away")

    async def send_raw(self, raw: bytes, message: Any = None) -> None:
        self.queue_raw(raw, message)
        await self.flush()

    async def send(self, message: JsonObject) -> None:
        await self.send_raw(jsonrpc.encode(message), message)


class AgentConnection:
    """One agent process and the requests in flight on it (implements ``AgentLink``)."""

    def __init__(self, bridge: Bridge, process: AgentProcess, name: str) -> None:
        self.bridge = bridge
        self.process = process
        self.name = name
        self.initialize_result: JsonObject | None = None
        self.own: dict[RequestId, trio.MemorySendChannel[Frame | AgentExited]] = {}
        self.forwarded: dict[RequestId, Forwarded] = {}
        self.exit_status: int | None = None
        self.closed = False
        self.done = trio.Event()
        self.read_scope: trio.CancelScope | None = None  # the pending read of stdout
        self.outbox = Outbox(process.stdin)
        self._ids = itertools.count(1)

    def in_flight(self, request_id: RequestId) -> bool:
        return request_id in self.own or request_id in self.forwarded

    def fresh_id(self) -> str:
        while True:
            candidate = f"acp-bridge-{next(self._ids)}"
            if not self.in_flight(candidate):
                return candidate

    def queue_raw(self, raw: bytes, message: Any = None) -> None:
        self.bridge.tracer.record(f"bridge->{self.name}", raw, message)
        self.outbox.queue(raw)

    def queue(self, message: Any) -> None:
        self.queue_raw(jsonrpc.encode(message), message)

    async def flush(self) -> None:
        try:
            await self.outbox.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            log.debug("%s: write failed; the agent is gone", self.name)

    async def send_raw(self, raw: bytes, message: Any = None) -> None:
        self.queue_raw(raw, message)
        await self.flush()

    async def send(self, message: Any) -> None:
        await self.send_raw(jsonrpc.encode(message), message)

    async def request(self, method: str, params: JsonObject) -> Any:
        """A request of the bridge's own: result, or AgentError / AgentExited."""
        if self.closed:
            raise AgentExited(self.exit_status)
        request_id = self.fresh_id()
        send, receive = trio.open_memory_channel[Frame | AgentExited](1)
        self.own[request_id] = send
        await self.send(jsonrpc.request(request_id, method, params))
        answer = await receive.receive()
        if isinstance(answer, AgentExited):
            raise answer
        if "error" in answer.message:
            raise AgentError(answer.message["error"])
        return answer.message.get("result")

    async def notify(self, method: str, params: JsonObject) -> None:
        await self.send(jsonrpc.notification(method, params))

    def fail_all(self) -> list[Forwarded]:
        """The agent is gone: wake every waiter; return client requests nobody waits for."""
        self.closed = True
        exited = AgentExited(self.exit_status)
        for waiter in self.own.values():
            waiter.send_nowait(exited)
        self.own.clear()
        orphans = []
        for pending in self.forwarded.values():
            if pending.waiter is not None:
                pending.waiter.send_nowait(exited)
            else:
                orphans.append(pending)
        self.forwarded.clear()
        return orphans


class Call:
    """An intercepted client request on its way through an adapter hook (``LifecycleCall``)."""

    def __init__(
        self,
        bridge: Bridge,
        frame: Frame,
        link: AgentConnection,
        *,
        params: JsonObject,
        started: Callable[[], None],
    ) -> None:
        self.bridge = bridge
        self.frame = frame
        self.method: str = frame.method or ""
        self.link = link
        self.params = params
        self.original_params: JsonObject = frame.params
        self.prompt: SystemPrompt | None = None
        self.previous: SystemPrompt | None = None
        self.session_id: str | None = (
            params.get("sessionId") if isinstance(params.get("sessionId"), str) else None
        )
        self.client_sent_prompt = False
        self.delivered: str | None = None
        self._started = started

    async def forward(self, link: AgentLink | None = None) -> Reply:
        target = link if isinstance(link, AgentConnection) else self.link
        unchanged = self.params == self.original_params
        message = None if unchanged else {**self.frame.message, "params": self.params}
        send, receive = trio.open_memory_channel[Frame | AgentExited](1)
        wire_id = self.bridge.forward_request(target, self.frame, message, waiter=send)
        await target.flush()
        self._started()
        answer = await receive.receive()
        if isinstance(answer, AgentExited):
            return Reply.internal(str(answer), {"exitStatus": answer.status})
        body = answer.message
        raw = answer.raw if wire_id == self.frame.id else None
        return Reply(result=body.get("result"), error=body.get("error"), frame_bytes=raw)

    def mark_delivered(self, fingerprint: str | None) -> None:
        if self.session_id is not None:
            self.bridge.lifecycle.set_delivered(self.session_id, fingerprint)


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
    ) -> None:
        self.options = options
        self.client_in = client_in
        self.tracer = tracer or Tracer(None)
        self.client = ClientSide(client_out, self.tracer)
        self.lifecycle = lifecycle
        self.registry = registry or AdapterRegistry()
        self.adapter: Adapter | None = None
        self.delivery: Delivery | None = None
        self.links: list[AgentConnection] = []
        # Every process this connection started, attached or not: shutdown stops them all.
        self.processes: list[AgentProcess] = []
        self._primary: AgentConnection | None = None
        self._primary_process: AgentProcess | None = None
        # Agent->client requests in flight: client-facing id -> (connection, agent's id).
        self.agent_requests: dict[RequestId, tuple[AgentConnection, RequestId]] = {}
        self.agent_request_ids: dict[tuple[int, RequestId], RequestId] = {}
        # Client request id -> where it went, for $/cancel_request.
        self.client_requests: dict[RequestId, tuple[AgentConnection, RequestId]] = {}
        self.initialize_params: Any = None
        self.authenticate_params: Any = None
        self.live: set[str] = set()
        self.log = log
        self._client_ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._exit_status: int | None = None
        self._stopping = False
        self._finished = trio.Event()
        # Set once initialize has been answered (or failed): the adapter is chosen by then.
        self._initialized = trio.Event()

    # ----------------------------------------------------------------- running

    async def start_agent(self) -> None:
        """Start the primary agent process; raises AgentStartError if it cannot start."""
        self._primary_process = await AgentProcess.start(
            self.options.agent_argv, extra_env=self.options.agent_env
        )
        self.processes.append(self._primary_process)

    async def run(self, *, watch_signals: bool = True) -> int:
        """Relay until the client leaves, the agent exits or a signal arrives; the exit status."""
        try:
            if self._primary_process is None:
                await self.start_agent()
            assert self._primary_process is not None
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._primary = self._attach(self._primary_process, "agent")
                if watch_signals:
                    nursery.start_soon(self._watch_signals)
                nursery.start_soon(self._pump_client)
                nursery.start_soon(self._watch_client_output)
                await self._finished.wait()
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

    def _attach(self, process: AgentProcess, name: str) -> AgentConnection:
        assert self._nursery is not None
        link = AgentConnection(self, process, name)
        self.links.append(link)
        self._nursery.start_soon(self._pump_agent, link)
        return link

    async def spawn_agent(
        self, extra_args: Sequence[str] = (), extra_env: dict[str, str] | None = None
    ) -> AgentConnection:
        """Start another process of the agent and replay the client's initialize to it."""
        if self._stopping:
            raise AgentExited(None)
        argv = [*self.options.agent_argv, *extra_args]
        env = {**self.options.agent_env, **(extra_env or {})}
        process = await AgentProcess.start(argv, extra_env=env)
        self.processes.append(process)
        link = self._attach(process, f"agent-{len(self.links)}")
        try:
            if self.initialize_params is not None:
                link.initialize_result = await link.request("initialize", self.initialize_params)
            if self.authenticate_params is not None:
                await link.request("authenticate", self.authenticate_params)
        except (AgentError, AgentExited):
            # A process that cannot be used must not outlive the failed start.
            await self.stop_agent(link)
            raise
        return link

    async def stop_agent(self, link: AgentLink) -> None:
        assert isinstance(link, AgentConnection)
        await link.process.stop(self.options.shutdown_grace)
        await link.done.wait()

    @property
    def primary(self) -> AgentConnection:
        """The agent process started first; it answers everything not routed elsewhere."""
        assert self._primary is not None, "the bridge is not running"
        return self._primary

    def live_sessions(self) -> set[str]:
        return set(self.live)

    def adapter_options(self, adapter: str) -> Mapping[str, Any]:
        return self.options.adapter_options.get(adapter, {})

    def start_soon(self, async_fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run background work of an adapter for as long as the connection lives."""
        assert self._nursery is not None
        self._nursery.start_soon(async_fn, *args)

    async def _shutdown(self, status: Callable[[], int]) -> None:
        """Stop every agent process (stdin EOF, grace, SIGTERM, grace, SIGKILL).

        The first cause of shutdown decides the exit status; later ones only wait.
        """
        if self._stopping:
            await self._finished.wait()
            return
        self._stopping = True
        with trio.CancelScope(shield=True):
            stopped: set[int] = set()
            # A process started while others were stopping is stopped in the next round.
            while pending := [p for p in self.processes if id(p) not in stopped]:
                stopped.update(id(p) for p in pending)
                async with trio.open_nursery() as nursery:
                    for process in pending:
                        nursery.start_soon(process.stop, self.options.shutdown_grace)
            self._exit_status = status()
        self._finished.set()

    async def _watch_client_output(self) -> None:
        """A client that closed our stdout is gone even if its end of stdin stays open."""
        await self.client.went_away.wait()
        await self._shutdown(self._status_after_client_left)

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                log.info("signal %d: shutting down", signum)
                await self._shutdown(lambda: 128 + signum)  # noqa: B023
                return

    # ------------------------------------------------------------ client side

    async def _pump_client(self) -> None:
        splitter = LineSplitter(self.options.line_limit)
        while True:
            try:
                data = await self.client_in.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            items = splitter.feed(data) if data else splitter.close()
            for item in items:
                if isinstance(item, Line):
                    await self._from_client(item.data)
                else:
                    self.client.queue(
                        jsonrpc.error_response(
                            None,
                            jsonrpc.INVALID_REQUEST,
                            f"The message is {item.size} bytes, more than the line limit of "
                            f"{splitter.limit} bytes.",
                        )
                    )
            await self._flush_client_pump()
            if not data:
                log.debug("client closed its input")
                await self._shutdown(self._status_after_client_left)
                return

    async def _flush_client_pump(self) -> None:
        """Write what the client pump queued, to every peer, before it reads or waits again."""
        await self.client.flush()
        for link in tuple(self.links):
            await link.flush()

    def _status_after_client_left(self) -> int:
        """The agent's own status if it ended by itself on EOF, else 0: we stopped it."""
        process = self.primary.process
        if process.terminated_by_bridge or process.returncode is None:
            return 0
        return exit_status(process.returncode)

    async def _from_client(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            frame = jsonrpc.parse(raw)
        except FrameError as exc:
            self.tracer.record("client->bridge", raw, None)
            self.client.queue(jsonrpc.error_response(exc.request_id, exc.code, exc.message))
            return
        self.tracer.record("client->bridge", raw, frame.message)
        if frame.kind is Kind.REQUEST:
            await self._client_request(frame)
        elif frame.kind is Kind.NOTIFICATION:
            self._client_notification(frame)
        elif frame.kind is Kind.RESPONSE:
            self._client_response(frame)
        else:
            self._client_batch(frame)

    def _intercepts(self, method: str | None) -> bool:
        if method == "initialize":
            return True
        if self.adapter is None or self.delivery is None or method not in HOOKS:
            return False
        return method != "session/prompt" or self.adapter.intercepts_prompt

    async def _client_request(self, frame: Frame) -> None:
        if frame.method == "authenticate":
            self.authenticate_params = frame.params
        if frame.method in HOOKS and self.initialize_params is not None:
            # A client that pipelines session/new behind initialize must not slip past
            # validation while the adapter is still being chosen; hold it until then.
            if not self._initialized.is_set():
                await self._flush_client_pump()  # what came before it need not wait
            await self._initialized.wait()
        if self._intercepts(frame.method) and isinstance(frame.params, dict):
            assert self._nursery is not None
            # A handler may take long before it forwards (starting an agent, say): what the
            # client sent before this request goes out first.
            await self._flush_client_pump()
            # Wait until the handler has forwarded (or answered) so later client frames,
            # such as a session/cancel, cannot overtake the request they refer to.
            await self._nursery.start(self._intercept, frame)
            return
        self.forward_request(self._route(frame), frame, None)

    def _route(self, frame: Frame) -> AgentConnection:
        if self.adapter is not None:
            link = self.adapter.route(frame.method or "", frame.params)
            if isinstance(link, AgentConnection) and not link.closed:
                return link
        return self.primary

    def forward_request(
        self,
        link: AgentConnection,
        frame: Frame,
        message: JsonObject | None,
        *,
        waiter: trio.MemorySendChannel[Frame | AgentExited] | None = None,
    ) -> RequestId:
        """Queue a client request to an agent, translating its id only on collision."""
        client_id = frame.id
        wire_id = link.fresh_id() if link.in_flight(client_id) else client_id
        if link.closed:
            exited = AgentExited(link.exit_status)
            if waiter is not None:
                waiter.send_nowait(exited)
            else:
                self._fail_client_request(client_id, exited)
            return wire_id
        link.forwarded[wire_id] = Forwarded(client_id, frame.method, waiter)
        self.client_requests[client_id] = (link, wire_id)
        if message is None and wire_id == client_id:
            link.queue_raw(frame.raw, frame.message)
        else:
            link.queue({**(message or frame.message), "id": wire_id})
        return wire_id

    def _fail_client_request(self, client_id: RequestId, exited: AgentExited) -> None:
        self.client.queue(
            jsonrpc.error_response(
                client_id, jsonrpc.INTERNAL_ERROR, str(exited), {"exitStatus": exited.status}
            )
        )

    def _client_notification(self, frame: Frame) -> None:
        params = frame.params
        if (
            frame.method == CANCEL_REQUEST
            and isinstance(params, dict)
            and is_request_id(params.get("requestId"))
        ):
            target = self.client_requests.get(params.get("requestId"))
            if target is not None:
                link, wire_id = target
                if wire_id == params.get("requestId"):
                    link.queue_raw(frame.raw, frame.message)
                else:
                    changed = {**params, "requestId": wire_id}
                    link.queue({**frame.message, "params": changed})
                return
        self._route(frame).queue_raw(frame.raw, frame.message)

    def _client_response(self, frame: Frame) -> None:
        target = self.agent_requests.pop(frame.id, None)
        if target is None:
            log.debug("client answered unknown request id %r; passing it to the agent", frame.id)
            self.primary.queue_raw(frame.raw, frame.message)
            return
        link, agent_id = target
        self.agent_request_ids.pop((id(link), agent_id), None)
        if agent_id == frame.id:
            link.queue_raw(frame.raw, frame.message)
        else:
            link.queue({**frame.message, "id": agent_id})

    def _client_batch(self, frame: Frame) -> None:
        """v2 batches pass through; lifecycle methods must not be batched (v2 transports)."""
        members = frame.message
        intercepted = [
            m for m in members if isinstance(m, dict) and self._intercepts(m.get("method"))
        ]
        if intercepted:
            # The batch is refused whole: answering part of it would split what the client
            # sent as one unit.
            errors = [
                jsonrpc.error_response(
                    m.get("id"),
                    jsonrpc.INVALID_REQUEST,
                    f"The method {m.get('method')} must not be sent in a batch."
                    if m in intercepted
                    else "The batch holds session requests, which must not be batched.",
                )
                for m in members
                if isinstance(m, dict) and "id" in m and "method" in m
            ]
            if errors:
                self.client.queue_raw(jsonrpc.encode(errors), errors)
            return
        for member in members:
            if not isinstance(member, dict) or not is_request_id(member.get("id")):
                continue  # malformed members are the agent's to answer
            if "method" in member and "id" in member:
                self.primary.forwarded[member["id"]] = Forwarded(member["id"], member["method"])
            elif "method" not in member and "id" in member:
                self.agent_requests.pop(member["id"], None)
        self.primary.queue_raw(frame.raw, frame.message)

    # ------------------------------------------------------------- agent side

    async def _pump_agent(self, link: AgentConnection) -> None:
        async with trio.open_nursery() as nursery:
            # The agent's stdout ends at EOF, or shortly after the agent exits: a grandchild
            # that inherited the pipe (npx and similar wrappers) may hold it open for ever.
            exited = trio.Event()
            nursery.start_soon(self._watch_agent_exit, link, exited)
            await self._read_agent(link, exited)
            nursery.cancel_scope.cancel()
        await self._agent_gone(link)

    async def _watch_agent_exit(self, link: AgentConnection, exited: trio.Event) -> None:
        await link.process.wait()
        exited.set()
        if link.read_scope is not None:
            # Whatever the agent wrote before exiting is already in the pipe.
            link.read_scope.deadline = trio.current_time() + AGENT_EXIT_DRAIN

    async def _read_agent(self, link: AgentConnection, exited: trio.Event) -> None:
        splitter = LineSplitter(self.options.line_limit)
        stream = link.process.stdout
        while True:
            data: bytes | bytearray = b""
            # Only the read is cancelled, never a frame half-written to the client.
            with trio.CancelScope() as read_scope:
                if exited.is_set():
                    read_scope.deadline = trio.current_time() + AGENT_EXIT_DRAIN
                else:
                    link.read_scope = read_scope
                try:
                    data = await stream.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
            link.read_scope = None
            items = splitter.feed(data) if data else splitter.close()
            for item in items:
                if isinstance(item, Line):
                    self._from_agent(link, item.data)
                else:
                    log.warning(
                        "%s: dropped a %d-byte line over the line limit", link.name, item.size
                    )
            # An agent pump writes only to the client.
            await self.client.flush()
            if not data:
                break

    async def _agent_gone(self, link: AgentConnection) -> None:
        with trio.move_on_after(self.options.shutdown_grace):
            link.exit_status = await link.process.wait()
        if link.exit_status is None:
            link.exit_status = await link.process.stop(self.options.shutdown_grace)
        # An agent the bridge itself stopped (it ignored EOF, as codex-acp does) is no news.
        expected = link.exit_status == 0 or link.process.terminated_by_bridge
        log.log(
            logging.INFO if expected else logging.WARNING,
            "%s: %s",
            link.name,
            describe_exit(link.exit_status),
        )
        for orphan in link.fail_all():
            self._fail_client_request(orphan.client_id, AgentExited(link.exit_status))
        await self.client.flush()
        for client_id, (other, _) in list(self.client_requests.items()):
            if other is link:
                del self.client_requests[client_id]
        link.done.set()
        if link is self.primary:
            status = exit_status(link.exit_status)
            await self._shutdown(lambda: status)

    def _from_agent(self, link: AgentConnection, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            frame = jsonrpc.parse(raw)
        except FrameError as exc:
            preview = raw[:200].decode(errors="replace")
            log.warning("%s: dropped a line that is not JSON-RPC (%s): %s", link.name, exc, preview)
            return
        self.tracer.record(f"{link.name}->bridge", raw, frame.message)
        if frame.kind is Kind.RESPONSE:
            self._agent_response(link, frame)
        elif frame.kind is Kind.REQUEST:
            self._agent_request(link, frame)
        elif frame.kind is Kind.NOTIFICATION:
            self._agent_notification(link, frame)
        else:
            self._agent_batch(link, frame)

    def _agent_response(self, link: AgentConnection, frame: Frame) -> None:
        wire_id = frame.id
        own = link.own.pop(wire_id, None)
        if own is not None:
            own.send_nowait(frame)
            return
        pending = link.forwarded.pop(wire_id, None)
        if pending is None:
            log.debug("%s: response to unknown id %r passed through", link.name, wire_id)
            self.client.queue_raw(frame.raw, frame.message)
            return
        if self.client_requests.get(pending.client_id) == (link, wire_id):
            del self.client_requests[pending.client_id]
        if pending.waiter is not None:
            pending.waiter.send_nowait(frame)
        elif wire_id == pending.client_id:
            self.client.queue_raw(frame.raw, frame.message)
        else:
            self.client.queue({**frame.message, "id": pending.client_id})

    def _agent_request(self, link: AgentConnection, frame: Frame) -> None:
        agent_id = frame.id
        client_id: RequestId = agent_id
        while client_id in self.agent_requests:
            client_id = f"acp-bridge-{next(self._client_ids)}"
        self.agent_requests[client_id] = (link, agent_id)
        self.agent_request_ids[(id(link), agent_id)] = client_id
        if client_id == agent_id:
            self.client.queue_raw(frame.raw, frame.message)
        else:
            self.client.queue({**frame.message, "id": client_id})

    def _agent_notification(self, link: AgentConnection, frame: Frame) -> None:
        params = frame.params
        if (
            frame.method == CANCEL_REQUEST
            and isinstance(params, dict)
            and is_request_id(params.get("requestId"))
        ):
            client_id = self.agent_request_ids.get((id(link), params.get("requestId")))
            if client_id is not None and client_id != params.get("requestId"):
                changed = {**params, "requestId": client_id}
                self.client.queue({**frame.message, "params": changed})
                return
        self.client.queue_raw(frame.raw, frame.message)

    def _agent_batch(self, link: AgentConnection, frame: Frame) -> None:
        for member in frame.message:
            if not isinstance(member, dict) or "id" not in member:
                continue
            if not is_request_id(member["id"]):
                continue
            if "method" in member:
                self.agent_requests[member["id"]] = (link, member["id"])
            else:
                pending = link.forwarded.pop(member["id"], None)
                if pending is not None:
                    self.client_requests.pop(pending.client_id, None)
        self.client.queue_raw(frame.raw, frame.message)

    # ------------------------------------------------------- intercepted calls

    async def _intercept(
        self, frame: Frame, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        started = False

        def mark_started() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        try:
            reply = await self._handle(frame, mark_started)
        except Exception as exc:
            log.exception("handling %s failed", frame.method)
            reply = Reply.internal(f"The bridge failed to handle {frame.method}.", str(exc))
        finally:
            mark_started()
        await self._answer(frame, reply)

    async def _answer(self, frame: Frame, reply: Reply) -> None:
        if reply.frame_bytes is not None:
            await self.client.send_raw(reply.frame_bytes)
        elif reply.error is not None:
            await self.client.send({"jsonrpc": "2.0", "id": frame.id, "error": reply.error})
        else:
            await self.client.send(jsonrpc.result_response(frame.id, reply.result))

    async def _handle(self, frame: Frame, started: Callable[[], None]) -> Reply:
        params: JsonObject = dict(frame.params)
        call = Call(self, frame, self._route(frame), params=params, started=started)
        if frame.method == "initialize":
            try:
                return await self._initialize(call)
            finally:
                self._initialized.set()
        assert self.adapter is not None
        if call.method != "session/new" and call.session_id is not None:
            # What the named session (for fork: the parent) has been running with.
            record = self.lifecycle.get(call.session_id)
            if record is not None:
                call.prompt = call.previous = record.prompt
                call.delivered = record.delivered
        if frame.method in LIFECYCLE:
            try:
                self._prepare_lifecycle(call)
            except PromptRejected as rejected:
                return Reply(error=rejected.error())
        hook = getattr(self.adapter, HOOKS[call.method])
        reply: Reply = await hook(call)
        if reply.ok:
            self._record(call, reply)
        return reply

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
        delivery = self.adapter.delivery(result)
        if delivery is not None and not self.options.allow_override:
            delivery = Delivery(append=delivery.append, override=False)
        self.delivery = delivery
        # Sessions are stored per agent identity: its agentInfo.name, else its command.
        self.lifecycle.agent = capabilities.agent_name(result) or self.lifecycle.agent
        log.info("adapter %s; delivery %s", self.adapter.name, delivery)
        if delivery is None:
            return reply
        advertised = capabilities.advertise(
            self.adapter.adjust_capabilities(copy.deepcopy(result)),
            delivery,
            adapter=self.adapter.name,
        )
        return reply.with_result(advertised)

    def _choose_adapter(self, initialize_result: JsonObject) -> None:
        if self.options.adapter == AUTO:
            adapter_class = self.registry.choose(initialize_result)
        else:
            adapter_class = self.registry.get(self.options.adapter)
        self.adapter = adapter_class(self)

    def _prepare_lifecycle(self, call: Call) -> None:
        """Validate the client's systemPrompt and apply the on_omitted policy (spec §5, §6)."""
        assert self.delivery is not None
        raw_prompt = call.params.pop("systemPrompt", None)
        prompt = parse_system_prompt(
            raw_prompt,
            override_allowed=self.delivery.override,
            max_bytes=self.options.max_prompt_bytes,
        )
        call.client_sent_prompt = prompt is not None
        if prompt is None and self.options.on_omitted == "keep":
            prompt = call.previous
        call.prompt = prompt

    def _record(self, call: Call, reply: Reply) -> None:
        result = reply.result if isinstance(reply.result, dict) else {}
        new_id = result.get("sessionId")
        if call.method == "session/new" and isinstance(new_id, str):
            self.lifecycle.save(new_id, call.prompt)
            self.live.add(new_id)
        elif call.method == "session/fork" and isinstance(new_id, str):
            self.lifecycle.save(new_id, call.prompt, parent_id=call.session_id)
            if call.prompt is not None and call.delivered == call.prompt.fingerprint():
                self.lifecycle.set_delivered(new_id, call.delivered)
            self.live.add(new_id)
        elif call.session_id is None:
            return
        elif call.method in ("session/load", "session/resume"):
            self.lifecycle.save(call.session_id, call.prompt)
            self.live.add(call.session_id)
        elif call.method == "session/close":
            self.lifecycle.set_live(call.session_id, False)
            self.live.discard(call.session_id)
        elif call.method == "session/delete":
            self.lifecycle.forget(call.session_id)
            self.live.discard(call.session_id)
