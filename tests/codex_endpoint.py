"""A real codex behind the bridge CLI, with a private ``CODEX_HOME``, against the model
endpoint (OpenAI Responses flavour): what the codex-acp 0.x and 2.x end-to-end tests share.

The home is kept outside /tmp (codex refuses to put its helper binaries under a temporary
folder). A turn's model request is found by the ``session-id`` header codex sends. Each
test file says how its codex-acp is started (:meth:`CodexOnEndpoint.agent_argv`) and how
its processes are found; the bridge in front of it, and what must be left when the client
closes, are the same for both.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import agents  # tests/agents.py: installs and caches the pinned agents
import trio
from acp_requests import prompt_params, session_params
from bridge_cli import bridge_command

from acp_bridge.model_endpoint import ModelEndpoint, RecordedRequest
from acp_bridge.runtime.client import AcpClient, spawn_bridge

TIMEOUT: Final = 60.0
# The custom provider codex is configured with, and the key it sends the endpoint.
PROVIDER: Final = "acp-bridge-test"
API_KEY: Final = "sk-acp-bridge-test"
# What the bridge advertises as sessionCapabilities.systemPrompt in front of either codex.
ADVERTISED: Final[dict[str, Any]] = {"mode": {"override": {}}}


@contextmanager
def private_codex_home(prefix: str) -> Iterator[Path]:
    """A fresh CODEX_HOME outside /tmp (``$ACP_BRIDGE_E2E_HOME`` or the user's cache),
    removed afterwards."""
    base = Path(
        os.environ.get("ACP_BRIDGE_E2E_HOME") or Path.home() / ".cache" / "acp-bridge" / "e2e"
    )
    base.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class CodexOnEndpoint(ABC):
    """A codex user: its CODEX_HOME, the bridge's state file, the endpoint it calls."""

    home: Path
    state: Path
    endpoint: ModelEndpoint

    @abstractmethod
    def agent_argv(self) -> list[str]:
        """The codex-acp command the bridge starts."""

    @abstractmethod
    def processes(self) -> list[int]:
        """The live processes of this CODEX_HOME: codex-acp and whatever it started."""

    @abstractmethod
    def acp_processes(self) -> list[int]:
        """The codex-acp processes themselves."""

    def env(self) -> dict[str, str]:
        """The user's environment with this CODEX_HOME and the endpoint's key."""
        return agents.codex_endpoint_env(os.environ, self.home, API_KEY)

    def bridge_argv(self, *bridge_args: str) -> list[str]:
        return bridge_command(self.state, self.agent_argv(), *bridge_args)

    @asynccontextmanager
    async def bridge(self, *bridge_args: str) -> AsyncIterator[AcpClient]:
        """The bridge CLI in front of this codex, ``initialize`` answered."""
        async with spawn_bridge(self.bridge_argv(*bridge_args), self.env()) as (client, _):
            result = await client.request("initialize", {"protocolVersion": 1})
            capability = result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]
            assert capability == ADVERTISED
            yield client

    def requests_of(self, session_id: str) -> list[RecordedRequest]:
        return [
            r for r in self.endpoint.main_requests() if r.headers.get("session-id") == session_id
        ]


async def new_session(client: AcpClient, cwd: Path, prompt: dict[str, Any] | None = None) -> str:
    result = await client.request("session/new", session_params(cwd, prompt=prompt))
    session_id: str = result["sessionId"]
    return session_id


async def new_sessions(
    client: AcpClient, cwd: Path, prompts: Sequence[dict[str, Any] | None]
) -> list[str]:
    """A session per prompt (``None``: without one), in order."""
    return [await new_session(client, cwd, prompt) for prompt in prompts]


async def ask(codex: CodexOnEndpoint, client: AcpClient, session_id: str) -> RecordedRequest:
    """One turn; the model request it caused."""
    before = len(codex.requests_of(session_id))
    result = await client.request("session/prompt", prompt_params(session_id, "Hi."))
    assert result["stopReason"] == "end_turn"
    requests = codex.requests_of(session_id)
    assert len(requests) == before + 1
    return requests[-1]


async def ask_each_twice_at_once(
    codex: CodexOnEndpoint, client: AcpClient, sessions: Sequence[str]
) -> None:
    """Two rounds of one turn per session, the turns of a round running at once."""
    for _ in range(2):
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(ask, codex, client, session)


def describe(pid: int) -> str:
    """A process's command line, for a message."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "(gone)"


async def nothing_is_left_after_the_client_closes(
    codex: CodexOnEndpoint, cwd: Path, prompts: Sequence[dict[str, Any] | None], running: int
) -> None:
    """A session per prompt (``running`` codex-acp processes serve them), then the client
    closes its end: the bridge exits 0 and leaves no process of this CODEX_HOME and no
    private folder in it."""
    with trio.fail_after(TIMEOUT):
        async with spawn_bridge(codex.bridge_argv(), codex.env()) as (client, bridge):
            await client.request("initialize", {"protocolVersion": 1})
            await new_sessions(client, cwd, prompts)
            seen = {pid: describe(pid) for pid in codex.processes()}
            assert len(codex.acp_processes()) == running, seen
        assert bridge.returncode == 0
    left = {pid: describe(pid) for pid in codex.processes()}
    assert left == {}, f"left behind; there were {seen}"
    assert not [p for p in codex.home.iterdir() if p.name.startswith("acp-bridge-")]
