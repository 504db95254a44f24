"""GitHub Copilot CLI 1.0.102 through the bridge, end to end, against the model endpoint.

The real native copilot binary (npm ``@github/copilot-linux-x64``, cached by
``tests/agents.py``) runs behind the real bridge command line
(``python -m acp_bridge --state FILE -- copilot --acp``) with an isolated HOME, offline,
in its own-provider mode pointed at the endpoint's Chat Completions flavour (no GitHub
login). Each test asserts the system message the model received on a turn, picked by
the turn's user text.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import agents
import pytest
import trio
from conftest import run_verify

from acp_bridge.client import AcpClient, ClientRequestError, spawn_bridge
from acp_bridge.model_endpoint import ModelEndpoint, RecordedRequest, open_model_endpoint

pytestmark = pytest.mark.e2e

TIMEOUT = 120.0
COPILOT_DEFAULT_START = "You are GitHub Copilot"
# A YAML-looking first block (copilot reads front matter from instruction files), things
# other agents substitute, and whitespace at both ends.
AWKWARD = (
    "---\napplyTo: nothing/at/all\n---\n  {env:HOME} {file:/etc/hostname} {{x}} ${HOME} $& "
    "@README.md é\n\t  \n"
)


def text_prompt(mode: str, text: str) -> dict[str, Any]:
    return {"mode": mode, "content": [{"type": "text", "text": text}]}


def unpacked_cache() -> Path:
    """Where copilot unpacks itself on first start, shared by the tests (about 235 MB)."""
    return agents.cache_root().parent / "copilot-unpacked"


@dataclass
class CopilotHome:
    """An isolated copilot user (HOME with its ``~/.copilot`` session store) and the
    bridge's state file; it outlives bridge restarts."""

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

    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("COPILOT_", "GH_"))}
        base.pop("GITHUB_TOKEN", None)
        return {
            **agents.clean_agent_env(base),
            "COPILOT_PROVIDER_BASE_URL": f"{self.endpoint.url}/v1",
            "COPILOT_PROVIDER_API_KEY": "sk-fake",
            "COPILOT_MODEL": "gpt-4.1",
            "COPILOT_OFFLINE": "true",
            "COPILOT_AUTO_UPDATE": "false",
            "COPILOT_PKG_CACHE_HOME": str(unpacked_cache()),
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_STATE_HOME": str(self.home / ".local" / "state"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
        }

    def command(self) -> list[str]:
        state = str(self.root / "bridge-state.sqlite3")
        return [
            sys.executable,
            "-m",
            "acp_bridge",
            "--state",
            state,
            "--",
            str(self.binary),
            "--acp",
        ]

    def processes(self, *, only_copilot: bool = False) -> list[int]:
        """Live processes of this home (found by their environment): copilot and anything
        it started (``only_copilot``: the copilot processes themselves)."""
        marker = f"HOME={self.home}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                command = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if marker not in environ or state == "Z":
                continue
            if not only_copilot or command == str(self.binary).encode():
                found.append(int(entry.name))
        return found

    @asynccontextmanager
    async def bridge(self) -> AsyncIterator[Run]:
        async with spawn_bridge(self.command(), self.env()) as (client, _):
            with trio.fail_after(TIMEOUT):
                result = await client.request("initialize", {"protocolVersion": 1})
            yield Run(client, result, self)


@dataclass
class Run:
    """One bridge lifetime, seen from the client."""

    client: AcpClient
    initialize: dict[str, Any]
    home: CopilotHome

    async def new(self, prompt: dict[str, Any] | None = None) -> str:
        params: dict[str, Any] = {"cwd": self.home.cwd, "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        session_id: str = (await self.client.request("session/new", params))["sessionId"]
        return session_id

    async def load(self, session_id: str) -> None:
        params = {"sessionId": session_id, "cwd": self.home.cwd, "mcpServers": []}
        await self.client.request("session/load", params)

    async def turn(self, session_id: str) -> RecordedRequest:
        """One prompt; the model request of that turn."""
        token = f"turn-{next(self.home.turns)}-of-{session_id}"
        await self.client.request(
            "session/prompt",
            {"sessionId": session_id, "prompt": [{"type": "text", "text": token}]},
        )
        for request in self.home.endpoint.main_requests("openai-chat"):
            if token in request.last_user_text():
                return request
        raise AssertionError(f"no model request carried {token!r}")


@pytest.fixture(scope="session")
def copilot_binary() -> Path:
    return agents.copilot_binary()


@pytest.fixture
async def copilot(copilot_binary: Path, tmp_path: Path) -> AsyncIterator[CopilotHome]:
    (tmp_path / "project").mkdir()
    async with open_model_endpoint(reply="the fake model answers") as endpoint:
        home = CopilotHome(copilot_binary, tmp_path, endpoint)
        yield home
    assert home.processes() == []


def appended(request: RecordedRequest, text: str) -> bool:
    """``text`` arrived whole, on lines of its own, after copilot's own prompt."""
    (system,) = request.system_blocks()
    return system.startswith(COPILOT_DEFAULT_START) and f"\n\n{text}\n" in system


async def test_append_reaches_the_model_as_sent(copilot: CopilotHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with copilot.bridge() as run:
            session = await run.new(text_prompt("append", AWKWARD))
            request = await run.turn(session)
    assert appended(request, AWKWARD)


async def test_override_is_not_offered_and_is_refused(copilot: CopilotHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with copilot.bridge() as run:
            with pytest.raises(ClientRequestError) as refused:
                await run.new(text_prompt("override", "MARKER-O"))
            started = len(copilot.processes(only_copilot=True))
    capability = run.initialize["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]
    assert capability == {}
    assert refused.value.code == -32602
    assert started == 1  # the request never reached a process


async def test_sessions_with_different_prompts_share_one_connection(
    copilot: CopilotHome,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with copilot.bridge() as run:
            plain = await run.new()
            first = await run.new(text_prompt("append", "MARKER-ONE"))
            second = await run.new(text_prompt("append", "MARKER-TWO"))
            assert len(copilot.processes(only_copilot=True)) == 3
            seen: dict[str, RecordedRequest] = {}

            async def turn(session: str) -> None:
                seen[session] = await run.turn(session)

            async with trio.open_nursery() as nursery:
                for session in (plain, first, second):
                    nursery.start_soon(turn, session)
            listed = await run.client.request("session/list", {})
    assert "MARKER" not in seen[plain].system_text()
    assert seen[plain].system_text().startswith(COPILOT_DEFAULT_START)
    assert appended(seen[first], "MARKER-ONE") and "MARKER-TWO" not in seen[first].system_text()
    assert appended(seen[second], "MARKER-TWO") and "MARKER-ONE" not in seen[second].system_text()
    # Every process shares the user's ~/.copilot: one list has them all.
    assert {plain, first, second} <= {s["sessionId"] for s in listed["sessions"]}


async def test_load_after_a_bridge_restart_keeps_the_sessions_prompt(
    copilot: CopilotHome,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with copilot.bridge() as run:
            session = await run.new(text_prompt("append", AWKWARD))
            plain = await run.new()
            await run.turn(session)
            await run.turn(plain)
        assert copilot.processes() == []
        # An editor restart: the prompt is omitted on load and the bridge keeps it.
        async with copilot.bridge() as run:
            await run.load(session)
            await run.load(plain)
            again = await run.turn(session)
            plain_again = await run.turn(plain)
    assert appended(again, AWKWARD)
    assert len(again.user_texts()) == 2  # the first turn's history came back
    assert "MARKER" not in plain_again.system_text() and AWKWARD not in plain_again.system_text()


async def test_no_copilot_process_outlives_the_client(copilot: CopilotHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with copilot.bridge() as run:
            await run.new(text_prompt("append", "MARKER-A"))
            await run.new(text_prompt("append", "MARKER-B"))
            assert len(copilot.processes(only_copilot=True)) == 3
        # spawn_bridge closed the bridge's stdin and waited for it to exit.
        assert copilot.processes() == []


async def test_verify_passes_every_step_against_real_copilot(
    copilot_binary: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    # The preset unpacks copilot into $HOME/.cache/copilot: share the tests' copy instead.
    config.write_text(
        f"agents:\n  copilot:\n    command: {json.dumps(str(copilot_binary))}\n"
        "    args: [--acp]\n    verify:\n      env:\n"
        f"        COPILOT_PKG_CACHE_HOME: {json.dumps(str(unpacked_cache()))}\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("COPILOT_", "GH_"))}
    env = {**agents.clean_agent_env(base), "HOME": str(tmp_path)}
    report = await run_verify("--config", str(config), "--agent", "copilot", env=env, timeout=300)
    report.assert_passed()
    assert not (tmp_path / ".cache" / "copilot").exists()
    # Copilot has no session/fork: that row is skipped, every other one passes.
    assert report.table.count("PASS") == 6 and report.table.count("SKIP") == 1, report.table
