"""A real agent whose prompt is per process (gemini-cli, qwen-code) behind the bridge CLI.

The bridge runs as a subprocess (``python -m acp_bridge --state FILE -- <agent>``) with a
fresh ``HOME`` for the agent, pointed at the embedded model endpoint. Both agents make side
requests with other system prompts (routing, memory, suggestions), so a turn's main model
request is found by a token the test puts in its user text.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from acp_requests import append, override, prompt_params, session_params
from agent_processes import live_processes
from bridge_cli import bridge_command

from acp_bridge.model_endpoint import Flavour, ModelEndpoint, RecordedRequest, open_model_endpoint
from acp_bridge.runtime.client import AcpClient, spawn_bridge

TURN_TIMEOUT = 120.0


@dataclass
class PooledAgent:
    """One agent command, its environment and the endpoint its model calls go to."""

    command: list[str]
    env: dict[str, str]
    state: Path
    endpoint: ModelEndpoint
    flavour: Flavour
    home: Path
    cwd: Path
    turns: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def bridge_command(self, *bridge_args: str) -> list[str]:
        return bridge_command(self.state, self.command, *bridge_args)

    @asynccontextmanager
    async def bridge(self, *bridge_args: str) -> AsyncIterator[AcpClient]:
        async with spawn_bridge(self.bridge_command(*bridge_args), self.env) as (client, _):
            result = await client.request("initialize", {"protocolVersion": 1})
            capability = result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]
            assert capability == {"mode": {"override": {}}}
            yield client

    def processes(self) -> list[int]:
        """The agent's processes (and their children): every one has this HOME."""
        return live_processes(f"HOME={self.home}")

    async def new_session(self, client: AcpClient, prompt: dict[str, Any] | None = None) -> str:
        result = await client.request("session/new", session_params(self.cwd, prompt=prompt))
        session_id: str = result["sessionId"]
        return session_id

    async def reopen(
        self,
        client: AcpClient,
        method: str,
        session_id: str,
        prompt: dict[str, Any] | None = None,
    ) -> Any:
        return await client.request(method, session_params(self.cwd, session_id, prompt))

    async def systems_of(self, *prompts: dict[str, Any] | None) -> list[str]:
        """One bridge run: a session per prompt (``None``: no prompt), then a turn in each;
        the system text of each turn's main model request."""
        async with self.bridge() as client:
            sessions = [await self.new_session(client, prompt) for prompt in prompts]
            return [(await self.ask(client, session)).system_text() for session in sessions]

    async def ask(self, client: AcpClient, session_id: str) -> RecordedRequest:
        """One turn; the main model request it caused, found by its user text."""
        token = f"acp-bridge-e2e-turn-{next(self.turns)}"
        with trio.fail_after(TURN_TIMEOUT):
            result = await client.request(
                "session/prompt", prompt_params(session_id, f"{token}: hi")
            )
            assert result["stopReason"] == "end_turn", result
            return await self.request_with(token)

    async def request_with(self, token: str) -> RecordedRequest:
        def mine(request: RecordedRequest) -> bool:
            return any(token in text for text in request.user_texts())

        while True:
            known = self.endpoint.main_requests(self.flavour)
            found = [r for r in known if mine(r)]
            if found:
                return found[0]
            await self.endpoint.wait_for_requests(
                len(known) + 1, TURN_TIMEOUT, flavour=self.flavour
            )


@asynccontextmanager
async def open_pooled_agent(
    command: list[str],
    env: Callable[[Path, str], dict[str, str]],
    flavour: Flavour,
    tmp_path: Path,
) -> AsyncIterator[PooledAgent]:
    """The agent with a fresh HOME and project folder under ``tmp_path``, its model calls
    going to a new endpoint; ``env(home, endpoint_url)`` is its environment."""
    home = tmp_path / "home"
    home.mkdir()
    cwd = tmp_path / "project"
    cwd.mkdir()
    async with open_model_endpoint() as endpoint:
        yield PooledAgent(
            command,
            env(home, endpoint.url),
            tmp_path / "sessions.sqlite3",
            endpoint,
            flavour,
            home,
            cwd,
        )


async def assert_interleaved_sessions_keep_their_prompts(agent: PooledAgent) -> None:
    """An append, a plain and an override session on one connection, asked twice each
    with their turns running at once: every turn sees its own session's prompt only."""
    async with agent.bridge() as client:
        appended = await agent.new_session(client, append("MARKER-A"))
        plain = await agent.new_session(client)
        replaced = await agent.new_session(client, override("MARKER-O"))
        seen: dict[str, list[str]] = {appended: [], plain: [], replaced: []}

        async def turn(session: str) -> None:
            seen[session].append((await agent.ask(client, session)).system_text())

        for _ in range(2):
            async with trio.open_nursery() as nursery:
                for session in seen:
                    nursery.start_soon(turn, session)
    for system in seen[appended]:
        assert "MARKER-A" in system and "MARKER-O" not in system
    for system in seen[plain]:
        assert "MARKER" not in system
    for system in seen[replaced]:
        assert system.startswith("MARKER-O") and "MARKER-A" not in system
    assert all(len(systems) == 2 for systems in seen.values())


async def assert_no_process_outlives_the_client(agent: PooledAgent) -> None:
    """Three sessions (plain, append, override) run at least three agent processes; once
    the client closes the bridge's stdin, the bridge exits 0 and every one of them is gone."""
    async with spawn_bridge(agent.bridge_command(), agent.env) as (client, bridge):
        await client.request("initialize", {"protocolVersion": 1})
        await agent.new_session(client)
        await agent.new_session(client, append("MARKER-1"))
        await agent.new_session(client, override("MARKER-2"))
        assert len(agent.processes()) >= 3
    assert bridge.returncode == 0
    with trio.fail_after(5):
        while agent.processes():
            await trio.sleep(0.05)


def default_lines(system: str, min_length: int = 40) -> list[str]:
    """Long lines of an agent's default prompt, to tell whether it is kept or gone."""
    return [line.strip() for line in system.splitlines() if len(line.strip()) >= min_length]


def share_of(lines: list[str], system: str) -> float:
    return sum(1 for line in lines if line in system) / len(lines) if lines else 0.0


Check = Callable[[RecordedRequest], None]
