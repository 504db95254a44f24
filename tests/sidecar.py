"""The editor's end of a sidecar for the tests: ``acp-bridge connect`` as a subprocess.

Used by ``test_connect.py`` (a ``serve`` in this process) and by the container tests (a
``serve`` in a podman container). The token reaches ``connect`` the way an editor would
give it: through the environment, never argv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from conftest import RunningBridge, _reap

INITIALIZE: dict[str, Any] = {
    "protocolVersion": 1,
    "clientCapabilities": {},
    "clientInfo": {"name": "sidecar-test", "version": "0"},
}


def system_prompt(text: str) -> dict[str, Any]:
    return {"mode": "append", "content": [{"type": "text", "text": text}]}


@asynccontextmanager
async def open_connect(
    address: str,
    directory: Path,
    *,
    token: str | None = None,
    args: Sequence[str] = (),
) -> AsyncIterator[RunningBridge]:
    """``acp-bridge connect ADDRESS`` with ``token`` in ``ACP_BRIDGE_TOKEN`` (or none)."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "ACP_BRIDGE_TOKEN"}
    if token is not None:
        env["ACP_BRIDGE_TOKEN"] = token
    stderr_path = directory / "connect-stderr"
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "acp_bridge", "connect", *args, address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    editor = RunningBridge(directory, process=process, stderr_path=stderr_path)
    try:
        yield editor
    finally:
        with trio.CancelScope(shield=True):
            await _reap(editor)
