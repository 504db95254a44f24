"""What an adapter is lent: :class:`LentContext`, the one implementation of ``AdapterContext``.

An adapter reaches the agent processes, the sessions that are live, where a session lives,
background work and its options through this, and nothing else of the bridge: not the
router, the store or the pumps. It is lent over whatever holds the processes
(:class:`Lender`): the runtime's :class:`~acp_bridge.runtime.agents.Agents`, or, while the
early ``initialize`` answer is computed before the runtime has loaded
(:mod:`acp_bridge.runtime.early_initialize`), a holder with no process yet.

Standard library only: the early answer imports this module, and must not load trio.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import logging

    from acp_bridge.adapter import AgentLink


class Lender(Protocol):
    """What :class:`LentContext` needs of whatever holds the agent processes."""

    @property
    def env(self) -> Mapping[str, str]:
        """The environment the agent processes get on top of the bridge's."""

    @property
    def links(self) -> Mapping[int, Any]:
        """The bridge's own connection to each running process, by hop."""

    @property
    def primary(self) -> Any:
        """The process started first."""

    async def spawn(
        self,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        private_files: Sequence[str] = (),
    ) -> Any: ...

    async def stop(self, link: Any) -> None: ...


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
        agents: Lender,
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
