"""The agent processes of one client connection.

:class:`Agents` owns the processes: starting them through an injectable *spawner* (by
default :meth:`AgentProcess.start`, so tests can run coroutine agents over memory streams),
replaying the client's ``initialize`` and ``authenticate`` to each process started after
the first, stopping one, and stopping all of them in order at shutdown. A connection that
has started a process after the first (a pool's) keeps the next one's watchdog started
ahead of it (:data:`WATCHDOG_AHEAD_AFTER`), so that a new prompt's process does not wait
for one, and ends it with the connection. Reading what a
process writes is :mod:`acp_bridge.runtime.pumps`' job and writing to it
:mod:`acp_bridge.runtime.connection`'s; the relay hands each started process to
:class:`Agents` as a link. An adapter reaches them through
:class:`~acp_bridge.runtime.adapter_context.LentContext`, lent over :class:`Agents`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar

import trio

from acp_bridge.adapter import AgentError, AgentExited
from acp_bridge.core.router import PRIMARY
from acp_bridge.supervision.agent_process import (
    AgentProcess,
    cancel_prepared_watchdog,
    prepare_watchdog,
)
from acp_bridge.wire.jsonrpc import JsonObject

# How long after a process started after the first the next one's watchdog is started
# ahead of it (:meth:`Agents.spawn`): after the call that started the process, as a rule
# (codex-acp 0.16 answers the session/new that started it within about 0.1 s), so that
# the watchdog's start-up does not run beside that process's own.
WATCHDOG_AHEAD_AFTER: Final = 0.3


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
        # Whether a watchdog was started ahead for this connection's next process.
        self._ahead = False

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
        if isinstance(process, AgentProcess):
            # A process after the first: more may follow (a pool's), each with a watchdog
            # of its own, whose start-up is better done before the next one is asked for.
            trio.lowlevel.spawn_system_task(self._watchdog_ahead)
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

    async def _watchdog_ahead(self) -> None:
        """The next process's watchdog, started :data:`WATCHDOG_AHEAD_AFTER` seconds after
        a process; the connection's end ends it (:meth:`stop_all`)."""
        await trio.sleep(WATCHDOG_AHEAD_AFTER)
        if not self.stopping:
            self._ahead = True
            prepare_watchdog()

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
        if self._ahead:
            cancel_prepared_watchdog()
        stopped: set[int] = set()
        while pending := [p for p in self.processes if id(p) not in stopped]:
            stopped.update(id(p) for p in pending)
            async with trio.open_nursery() as nursery:
                for process in pending:
                    nursery.start_soon(process.stop, self.grace)
