"""The agent processes of one client connection, and what an adapter is lent.

:class:`Agents` owns the processes: starting them through an injectable *spawner* (by
default :meth:`AgentProcess.start`, so tests can run coroutine agents over memory streams),
replaying the client's ``initialize`` and ``authenticate`` to each process started after
the first, stopping one, and stopping all of them in order at shutdown. Reading what a
process writes and writing to it is the connection's job (:mod:`acp_bridge.runtime.relay`),
which hands each started process to :class:`Agents` as a link.

:class:`LentContext` is the one implementation of ``AdapterContext``
(:mod:`acp_bridge.adapter`) in the runtime: an adapter reaches processes and options
through it, and nothing else of the bridge (the early ``initialize`` path has its own,
which offers no processes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import trio

from acp_bridge.adapter import AgentError, AgentExited, AgentLink
from acp_bridge.core.router import PRIMARY
from acp_bridge.supervision.agent_process import AgentProcess
from acp_bridge.wire.jsonrpc import JsonObject


class AgentHandle(Protocol):
    """A started agent process as the runtime uses it (see :class:`AgentProcess`)."""

    terminated_by_bridge: bool

    @property
    def stdin(self) -> trio.abc.SendStream: ...

    @property
    def stdout(self) -> trio.abc.ReceiveStream: ...

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    async def stop(self, grace: float) -> int: ...


class Spawner(Protocol):
    """Starts an agent process. ``private_files`` (files or folders holding prompt text)
    are removed should the bridge die without stopping the process."""

    async def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], private_files: Sequence[str] = ()
    ) -> AgentHandle: ...


async def spawn_process(
    argv: Sequence[str], env: Mapping[str, str], private_files: Sequence[str] = ()
) -> AgentHandle:
    return await AgentProcess.start(argv, extra_env=env, private_files=private_files)


class Link(Protocol):
    """What :class:`Agents` needs of the connection to one process."""

    hop: int
    process: AgentHandle
    initialize_result: JsonObject | None

    async def request(self, method: str, params: JsonObject) -> Any: ...

    async def wait_closed(self) -> None: ...


L = TypeVar("L", bound=Link)


class Agents(Generic[L]):
    """The processes of one connection, the primary (hop 0) first."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        grace: float,
        spawner: Spawner,
        attach: Callable[[AgentHandle], L],
        replayed: Callable[[], Iterable[tuple[str, Any]]],
    ) -> None:
        self.argv = argv
        self.env = env
        self.grace = grace
        self.spawner = spawner
        # Connects a process started after the first (its pump, its hop in the router).
        self._attach = attach
        # The requests a later process gets before it is used (initialize, authenticate).
        self._replayed = replayed
        self.links: dict[int, L] = {}
        # Every process this connection started, attached or not: shutdown stops them all.
        self.processes: list[AgentHandle] = []
        self.primary_process: AgentHandle | None = None
        self.stopping = False

    @property
    def primary(self) -> L:
        """The process started first; it answers everything not routed elsewhere."""
        return self.links[PRIMARY]

    def adopt(self, process: AgentHandle) -> None:
        """Run with a primary process started before the bridge (see ``cli.run``)."""
        self.primary_process = process
        self.processes.append(process)

    async def start_primary(self) -> None:
        """Start the primary process; raises AgentStartError if it cannot start."""
        self.adopt(await self.spawner(self.argv, self.env))

    async def spawn(
        self,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        private_files: Sequence[str] = (),
    ) -> L:
        """Start another process of the agent and replay the client's requests to it."""
        if self.stopping:
            raise AgentExited(None)
        argv = [*self.argv, *extra_args]
        env = {**self.env, **(extra_env or {})}
        process = await self.spawner(argv, env, private_files)
        self.processes.append(process)
        link = self._attach(process)
        try:
            for method, params in self._replayed():
                result = await link.request(method, params)
                if method == "initialize":
                    link.initialize_result = result
        except (AgentError, AgentExited):
            # A process that cannot be used must not outlive the failed start.
            await self.stop(link)
            raise
        return link

    async def stop(self, link: L) -> None:
        await link.process.stop(self.grace)
        await link.wait_closed()

    def forget(self, process: AgentHandle) -> None:
        """A process is gone and read to the end: a long-lived bridge holds nothing for
        the pooled processes it saw come and go (while stopping, :meth:`stop_all` keeps
        each process it stops)."""
        if not self.stopping and process in self.processes:
            self.processes.remove(process)

    async def stop_all(self) -> None:
        """Stop every process (stdin EOF, grace, SIGTERM, grace, SIGKILL), those started
        while others were stopping in a next round."""
        self.stopping = True
        stopped: set[int] = set()
        while pending := [p for p in self.processes if id(p) not in stopped]:
            stopped.update(id(p) for p in pending)
            async with trio.open_nursery() as nursery:
                for process in pending:
                    nursery.start_soon(process.stop, self.grace)


class LentContext:
    """What the runtime lends an adapter (implements ``AdapterContext``), and nothing else
    of the bridge: through it an adapter cannot reach the router, the store or the pumps."""

    __slots__ = (
        "_adapter_options",
        "_agents",
        "_live",
        "_place",
        "_start_soon",
        "_unplace",
        "log",
    )

    def __init__(
        self,
        agents: Agents[Any],
        *,
        live: Callable[[], Iterable[str]],
        place: Callable[[str, int], None],
        unplace: Callable[[str], None],
        start_soon: Callable[..., None],
        adapter_options: Mapping[str, Mapping[str, Any]],
        log: logging.Logger,
    ) -> None:
        self._agents = agents
        self._live = live
        # Where a session lives, as values for the router's table (it calls no adapter).
        self._place = place
        self._unplace = unplace
        self._start_soon = start_soon
        self._adapter_options = adapter_options
        self.log = log

    @property
    def primary(self) -> AgentLink:
        link: AgentLink = self._agents.primary
        return link

    def live_sessions(self) -> set[str]:
        return set(self._live())

    def agent_environment(self) -> Mapping[str, str]:
        return {**os.environ, **self._agents.env}

    async def spawn_agent(
        self,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        private_files: Sequence[str] = (),
    ) -> AgentLink:
        link: AgentLink = await self._agents.spawn(extra_args, extra_env, private_files)
        return link

    async def stop_agent(self, link: AgentLink) -> None:
        await self._agents.stop(self._own(link, "stop_agent"))

    def place_session(self, session_id: str, link: AgentLink) -> None:
        self._place(session_id, self._own(link, "place_session").hop)

    def unplace_session(self, session_id: str) -> None:
        self._unplace(session_id)

    def _own(self, link: AgentLink, asked: str) -> Any:
        """The bridge's own connection that ``link`` is; anything else is refused."""
        mine = next((own for own in self._agents.links.values() if own is link), None)
        if mine is None:
            raise TypeError(f"{asked}() got a link this bridge did not make: {link!r}")
        return mine

    def start_soon(self, async_fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        self._start_soon(async_fn, *args)

    def adapter_options(self, adapter: str) -> Mapping[str, Any]:
        return self._adapter_options.get(adapter, {})
