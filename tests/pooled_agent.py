"""A real agent whose prompt is per process (gemini-cli, qwen-code) behind the bridge CLI.

The bridge runs as a subprocess (``python -m acp_bridge --state FILE -- <agent>``) with a
fresh ``HOME`` for the agent, pointed at the embedded model endpoint. Both agents make side
requests with other system prompts (routing, memory, suggestions), so a turn's main model
request is found by a token the test puts in its user text.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from acp_bridge.client import AcpClient, spawn_bridge
from acp_bridge.model_endpoint import Flavour, ModelEndpoint, RecordedRequest

TURN_TIMEOUT = 120.0


def append(text: str) -> dict[str, Any]:
    return {"mode": "append", "content": [{"type": "text", "text": text}]}


def override(text: str) -> dict[str, Any]:
    return {"mode": "override", "content": [{"type": "text", "text": text}]}


def processes_with_env(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker`` (``NAME=value``)."""
    wanted = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in environ and state != "Z":
            found.append(int(entry.name))
    return found


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
        return [
            sys.executable,
            "-m",
            "acp_bridge",
            "--state",
            str(self.state),
            *bridge_args,
            "--",
            *self.command,
        ]

    @asynccontextmanager
    async def bridge(self, *bridge_args: str) -> AsyncIterator[AcpClient]:
        async with spawn_bridge(self.bridge_command(*bridge_args), self.env) as (client, _):
            result = await client.request("initialize", {"protocolVersion": 1})
            capability = result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]
            assert capability == {"mode": {"override": {}}}
            yield client

    def processes(self) -> list[int]:
        """The agent's processes (and their children): every one has this HOME."""
        return processes_with_env(f"HOME={self.home}")

    async def new_session(self, client: AcpClient, prompt: dict[str, Any] | None = None) -> str:
        params: dict[str, Any] = {"cwd": str(self.cwd), "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        result = await client.request("session/new", params)
        session_id: str = result["sessionId"]
        return session_id

    async def reopen(
        self,
        client: AcpClient,
        method: str,
        session_id: str,
        prompt: dict[str, Any] | None = None,
    ) -> Any:
        params: dict[str, Any] = {"sessionId": session_id, "cwd": str(self.cwd), "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        return await client.request(method, params)

    async def ask(self, client: AcpClient, session_id: str) -> RecordedRequest:
        """One turn; the main model request it caused, found by its user text."""
        token = f"acp-bridge-e2e-turn-{next(self.turns)}"
        with trio.fail_after(TURN_TIMEOUT):
            result = await client.request(
                "session/prompt",
                {"sessionId": session_id, "prompt": [{"type": "text", "text": f"{token}: hi"}]},
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


def default_lines(system: str, min_length: int = 40) -> list[str]:
    """Long lines of an agent's default prompt, to tell whether it is kept or gone."""
    return [line.strip() for line in system.splitlines() if len(line.strip()) >= min_length]


def share_of(lines: list[str], system: str) -> float:
    return sum(1 for line in lines if line in system) / len(lines) if lines else 0.0


Check = Callable[[RecordedRequest], None]
