"""One client connection relayed to its agent processes: :class:`Bridge` and its options.

:class:`Bridge` owns no state of its own beyond its parts, which it makes, wires together
and runs in one nursery; each part is a module that says what it owns:

* :mod:`~acp_bridge.runtime.agents`: the agent processes (starting them through the
  injectable spawner, replaying to later ones, stopping);
* :mod:`~acp_bridge.runtime.adapter_context`: what an adapter is lent of them;
* :mod:`~acp_bridge.runtime.connection`: what is sent to each peer (the outboxes) and the
  router's output and events carried out;
* :mod:`~acp_bridge.runtime.pumps`: what is read from each peer;
* :mod:`~acp_bridge.runtime.interception`: one task per intercepted request, and the
  adapter whose hooks they run;
* :mod:`~acp_bridge.runtime.shutdown`: how the connection ends, and its exit status.

Where a frame goes, under which id and when is decided by
:class:`~acp_bridge.core.router.Router`, and every lifecycle rule by
:class:`~acp_bridge.core.sessions.SessionTable`; the runtime only carries them out.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from acp_bridge.adapter import Adapter
from acp_bridge.core.router import PRIMARY, Router
from acp_bridge.core.sessions import SessionTable
from acp_bridge.core.system_prompt import DEFAULT_MAX_PROMPT_BYTES
from acp_bridge.registry import AUTO, AdapterRegistry

# AgentHandle, Spawner, spawn_process, AgentConnection and Call are re-exported: tests,
# embedders and adapters written before the split name them through the relay.
from acp_bridge.runtime.agents import AgentHandle as AgentHandle  # noqa: PLC0414
from acp_bridge.runtime.agents import Agents
from acp_bridge.runtime.agents import Spawner as Spawner  # noqa: PLC0414
from acp_bridge.runtime.agents import spawn_process as spawn_process  # noqa: PLC0414
from acp_bridge.runtime.connection import AgentConnection as AgentConnection  # noqa: PLC0414
from acp_bridge.runtime.connection import Connection
from acp_bridge.runtime.interception import Call as Call  # noqa: PLC0414
from acp_bridge.runtime.interception import Interceptions
from acp_bridge.runtime.pumps import Pumps
from acp_bridge.runtime.refusal import refuse_requests
from acp_bridge.runtime.shutdown import Shutdown
from acp_bridge.runtime.trace import Tracer
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.supervision.agent_process import AgentStartError
from acp_bridge.wire.framing import DEFAULT_LINE_LIMIT, DEFAULT_STREAM_AFTER
from acp_bridge.wire.jsonrpc import Frame

log = logging.getLogger("acp_bridge")

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
    # allows it (see core/long_lines.py), instead of being gathered whole first; 0: never.
    stream_after: int = DEFAULT_STREAM_AFTER
    shutdown_grace: float = 2.0
    # Per-adapter settings (``bridge.adapter_options.<adapter>``), read by the adapter.
    adapter_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


class Bridge:
    """One client connection relayed to its agent process(es): the parts wired together.

    The parts, each in its own module: :class:`Agents` (the processes), :class:`Connection`
    (what is sent, and the router's output and events carried out), :class:`Interceptions`
    (the intercepted requests and the adapter), :class:`Pumps` (what is read) and
    :class:`Shutdown` (how it ends). :meth:`run` runs them in one nursery.
    """

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
        self.shutdown = Shutdown(self.connection, self.agents, client_in)
        self.pumps = Pumps(
            self.connection,
            self.agents,
            self.shutdown,
            client_in,
            self.tracer,
            line_limit=options.line_limit,
            stream_after=options.stream_after,
            grace=options.shutdown_grace,
        )
        self._nursery: trio.Nursery | None = None

    @property
    def adapter(self) -> Adapter | None:
        """The adapter, once the agent has answered ``initialize``."""
        return self.interceptions.adapter

    @property
    def primary(self) -> AgentConnection:
        """The agent process started first; it answers everything not routed elsewhere."""
        return self.agents.primary

    def adopt(self, process: AgentHandle) -> None:
        """Run with an agent process started before the bridge (see ``cli.run``)."""
        self.agents.adopt(process)

    async def start_agent(self) -> None:
        """Start the primary agent process; raises AgentStartError if it cannot start."""
        await self.agents.start_primary()

    async def spawn_agent(
        self,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        private_files: Sequence[str] = (),
    ) -> AgentConnection:
        """Start another process of the agent and replay the client's initialize to it."""
        return await self.agents.spawn(extra_args, extra_env, private_files)

    async def run(self, *, watch_signals: bool = True) -> int:
        """Relay until the client leaves, the agent exits or a signal arrives; the exit status."""
        if self.agents.primary_process is None:
            try:
                await self.start_agent()
            except AgentStartError as exc:
                return await self._refuse_client(exc)
        primary = self.agents.primary_process
        assert primary is not None
        shutdown = self.shutdown
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._attach(primary, PRIMARY, "agent")
                if watch_signals:
                    nursery.start_soon(shutdown.watch_signals)
                nursery.start_soon(self.pumps.pump_client)
                nursery.start_soon(shutdown.watch_client_output)
                nursery.start_soon(shutdown.watch_client_hangup)
                await shutdown.finished.wait()
                await shutdown.drain()
                nursery.cancel_scope.cancel()
        finally:
            # Cancelled from outside (a server closing, an early Ctrl-C): still no process
            # is left behind.
            if not shutdown.finished.is_set():
                await shutdown.stop(lambda: 0)
        if self.adapter is not None:
            with trio.CancelScope(shield=True):
                await self.adapter.aclose()
        return shutdown.exit_status if shutdown.exit_status is not None else 0

    def start_soon(self, async_fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run background work of an adapter for as long as the connection lives."""
        assert self._nursery is not None
        self._nursery.start_soon(async_fn, *args)

    def _intercept(self, token: int, frame: Frame) -> None:
        self.start_soon(self.interceptions.run, token, frame)

    def _attach(self, process: AgentHandle, hop: int, name: str) -> AgentConnection:
        link = AgentConnection(self.connection, process, hop, name)
        self.links[hop] = link
        self.start_soon(self.pumps.pump_agent, link)
        return link

    def _attach_later(self, process: AgentHandle) -> AgentConnection:
        hop = self.router.hops.add()
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
