"""A real codex behind the bridge CLI, with a private ``CODEX_HOME``, against the model
endpoint (OpenAI Responses flavour): what the codex-acp 0.x and 2.x end-to-end tests share.

The home is kept outside /tmp (codex refuses to put its helper binaries under a temporary
folder). A turn's model request is found by the ``session-id`` header codex sends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from acp_requests import prompt_params, session_params

from acp_bridge.model_endpoint import ModelEndpoint, RecordedRequest
from acp_bridge.runtime.client import AcpClient


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
class CodexOnEndpoint:
    """A codex user: its CODEX_HOME, the bridge's state file, the endpoint it calls."""

    home: Path
    state: Path
    endpoint: ModelEndpoint

    def requests_of(self, session_id: str) -> list[RecordedRequest]:
        return [
            r for r in self.endpoint.main_requests() if r.headers.get("session-id") == session_id
        ]


async def new_session(client: AcpClient, cwd: Path, prompt: dict[str, Any] | None = None) -> str:
    result = await client.request("session/new", session_params(cwd, prompt=prompt))
    session_id: str = result["sessionId"]
    return session_id


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
