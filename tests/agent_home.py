"""A real agent run as an isolated user behind the bridge CLI, over bridge restarts.

:class:`AgentHome` is the user: a private ``HOME`` (with its XDG folders) and project
folder under one root, the bridge's state file there, and the embedded model endpoint the
agent's model calls go to. Each ``bridge()`` is one ``python -m acp_bridge --state FILE --
<agent>`` lifetime, seen from the client as a :class:`BridgeRun`. Subclasses say how the
agent starts and what its environment holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, TypeVar

import trio
from acp_requests import prompt_params, session_params
from bridge_cli import bridge_command, isolated_env

from acp_bridge.model_endpoint import ModelEndpoint, RecordedRequest, open_model_endpoint
from acp_bridge.runtime.client import AcpClient, spawn_bridge

INITIALIZE_TIMEOUT = 120.0


@dataclass
class AgentHome:
    """An isolated user of the agent at ``binary``; it outlives bridge restarts, as a
    user's home would."""

    binary: Path
    root: Path
    endpoint: ModelEndpoint
    turns: count[int] = field(default_factory=lambda: count(1))

    @property
    def cwd(self) -> str:
        return str(self.root / "project")

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def state(self) -> Path:
        return self.root / "bridge-state.sqlite3"

    def agent_env(self, without: tuple[str, ...], settings: dict[str, str]) -> dict[str, str]:
        """This machine's environment less the user's own settings of the agent (variables
        starting with ``without``), with ``settings`` and this ``HOME`` and every XDG base
        folder inside it: nothing of this machine's user."""
        return isolated_env(
            self.home,
            without=without,
            XDG_CONFIG_HOME=str(self.home / ".config"),
            XDG_DATA_HOME=str(self.home / ".local" / "share"),
            XDG_STATE_HOME=str(self.home / ".local" / "state"),
            XDG_CACHE_HOME=str(self.home / ".cache"),
            **settings,
        )

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def agent_argv(self) -> list[str]:
        raise NotImplementedError

    def command(self, *bridge_args: str) -> list[str]:
        return bridge_command(self.state, self.agent_argv(), *bridge_args)

    @asynccontextmanager
    async def bridge(self, *bridge_args: str) -> AsyncIterator[BridgeRun]:
        async with spawn_bridge(self.command(*bridge_args), self.env()) as (client, _):
            with trio.fail_after(INITIALIZE_TIMEOUT):
                result = await client.request("initialize", {"protocolVersion": 1})
            yield BridgeRun(client, result, self)


Home = TypeVar("Home", bound=AgentHome)


@asynccontextmanager
async def open_agent_home(kind: type[Home], binary: Path, root: Path) -> AsyncIterator[Home]:
    """A fresh user of ``kind`` under ``root``, with its own model endpoint."""
    (root / "project").mkdir()
    async with open_model_endpoint(reply="the fake model answers") as endpoint:
        yield kind(binary, root, endpoint)


@dataclass
class BridgeRun:
    """One bridge lifetime, seen from the client."""

    client: AcpClient
    initialize: dict[str, Any]
    home: AgentHome

    async def new_result(self, prompt: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``session/new`` result."""
        params = session_params(self.home.cwd, prompt=prompt)
        result: dict[str, Any] = await self.client.request("session/new", params)
        return result

    async def new(self, prompt: dict[str, Any] | None = None) -> str:
        """A new session's id."""
        session_id: str = (await self.new_result(prompt))["sessionId"]
        return session_id

    async def reopen(
        self, method: str, session_id: str, prompt: dict[str, Any] | None = None
    ) -> Any:
        """``session/load``, ``session/resume`` or ``session/fork`` of a session; the result."""
        params = session_params(self.home.cwd, session_id, prompt)
        return await self.client.request(method, params)

    async def turn(self, session_id: str) -> RecordedRequest:
        """One prompt; the model request of that turn, found by its user text (an agent's
        side requests, such as a title, are not it)."""
        token = f"turn-{next(self.home.turns)}-of-{session_id}"
        await self.client.request("session/prompt", prompt_params(session_id, token))
        for request in self.home.endpoint.main_requests("openai-chat"):
            if token in request.last_user_text():
                return request
        raise AssertionError(f"no model request carried {token!r}")

    async def turns_at_once(self, *session_ids: str) -> dict[str, RecordedRequest]:
        """One turn in each session, all running at once; each session's model request."""
        seen: dict[str, RecordedRequest] = {}

        async def turn(session_id: str) -> None:
            seen[session_id] = await self.turn(session_id)

        async with trio.open_nursery() as nursery:
            for session_id in session_ids:
                nursery.start_soon(turn, session_id)
        return seen
