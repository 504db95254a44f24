"""opencode 1.18.33 through the bridge, end to end, against the embedded model endpoint.

The real opencode binary (npm ``opencode-ai``, cached by ``tests/agents.py``) runs behind
the real bridge command line (``python -m acp_bridge --state FILE -- opencode acp``) with
an isolated HOME and a provider, named in ``OPENCODE_CONFIG_CONTENT``, that speaks Chat
Completions to the endpoint. The npm registry is an unreachable local port, so opencode's
own plugin install stays offline. Each turn opencode also asks for a session title; the
test picks the turn's request by its user text and asserts its system message.
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
# The opening of opencode's own prompt for an OpenAI-compatible model (its default).
OPENCODE_DEFAULT_START = "You are opencode, an interactive CLI tool"
# What opencode's JSON config and agent files would change: substitution, a YAML-looking
# first line, templates, and whitespace at both ends.
AWKWARD = (
    "---\ntitle: not front matter\n---\n  {env:HOME} {file:/etc/hostname} {{x}} ${HOME} $& "
    "\\u007b é\n\t  \n"
)


def text_prompt(mode: str, text: str) -> dict[str, Any]:
    return {"mode": mode, "content": [{"type": "text", "text": text}]}


def mode_choice(result: dict[str, Any]) -> Any:
    """The mode selector a session/new or session/load result offers (opencode 1.18 puts
    its agents in ``configOptions``)."""
    return [option for option in result.get("configOptions", []) if option["id"] == "mode"]


@dataclass
class OpencodeHome:
    """An isolated opencode user (HOME, XDG dirs, its session database) and the bridge's
    state file; it outlives bridge restarts, as a user's home would."""

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
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "options": {"baseURL": f"{self.endpoint.url}/v1", "apiKey": "sk-fake"},
            "models": {"fake-model": {}},
        }
        config = {
            "model": "fake/fake-model",
            "small_model": "fake/fake-model",
            "provider": {"fake": provider},
        }
        base = {k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_")}
        return {
            **agents.clean_agent_env(base),
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "npm_config_registry": "http://127.0.0.1:9/",
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_DATA_HOME": str(self.home / ".local" / "share"),
            "XDG_STATE_HOME": str(self.home / ".local" / "state"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
        }

    def command(self) -> list[str]:
        state = str(self.root / "bridge-state.sqlite3")
        return [sys.executable, "-m", "acp_bridge", "--state", state, "--", str(self.binary), "acp"]

    def processes(self) -> list[int]:
        """Live opencode processes of this home (found by their environment)."""
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
            if marker in environ and state != "Z" and command.endswith(b"opencode.exe"):
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
    home: OpencodeHome

    async def new(self, prompt: dict[str, Any] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"cwd": self.home.cwd, "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        result: dict[str, Any] = await self.client.request("session/new", params)
        return result

    async def reopen(
        self, method: str, session_id: str, prompt: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"sessionId": session_id, "cwd": self.home.cwd, "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        result: dict[str, Any] = await self.client.request(method, params)
        return result

    async def turn(self, session_id: str) -> RecordedRequest:
        """One prompt; the model request of that turn (not opencode's title call)."""
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
def opencode_binary() -> Path:
    return agents.opencode_binary()


@pytest.fixture
async def opencode(opencode_binary: Path, tmp_path: Path) -> AsyncIterator[OpencodeHome]:
    (tmp_path / "project").mkdir()
    async with open_model_endpoint(reply="the fake model answers") as endpoint:
        home = OpencodeHome(opencode_binary, tmp_path, endpoint)
        yield home
    assert home.processes() == []


def appended(request: RecordedRequest, text: str) -> bool:
    """``text`` arrived whole as opencode's instructions entry, after its own prompt."""
    (system,) = request.system_blocks()
    return system.startswith(OPENCODE_DEFAULT_START) and f".md\n{text}\n" in system


def replaced(request: RecordedRequest, text: str) -> bool:
    """``text`` opens the system message and opencode's own prompt is gone."""
    (system,) = request.system_blocks()
    return system.startswith(text + "\n") and OPENCODE_DEFAULT_START not in system


async def test_append_reaches_the_model_as_sent(opencode: OpencodeHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            session = (await run.new(text_prompt("append", AWKWARD)))["sessionId"]
            request = await run.turn(session)
    assert appended(request, AWKWARD)
    assert "Instructions from: " in request.system_text()


async def test_override_replaces_opencodes_prompt_and_keeps_its_modes(
    opencode: OpencodeHome,
) -> None:
    native = agents.probe_initialize([str(opencode.binary), "acp"], opencode.env())["result"]
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            plain = await run.new()
            other = await run.new(text_prompt("override", AWKWARD))
            session = other["sessionId"]
            request = await run.turn(session)
            # The user switches to opencode's other mode: still the client's prompt.
            await run.client.request(
                "session/set_config_option",
                {"sessionId": session, "configId": "mode", "value": "plan"},
            )
            planned = await run.turn(session)
            plain_request = await run.turn(plain["sessionId"])
    capabilities = dict(run.initialize["agentCapabilities"])
    session_capabilities = dict(capabilities.pop("sessionCapabilities"))
    assert session_capabilities.pop("systemPrompt") == {"mode": {"override": {}}}
    capabilities.pop("_meta")
    assert capabilities == {
        k: v for k, v in native["agentCapabilities"].items() if k != "sessionCapabilities"
    }
    assert session_capabilities == native["agentCapabilities"]["sessionCapabilities"]
    (choice,) = mode_choice(other)
    assert [option["value"] for option in choice["options"]] == ["build", "plan"]
    assert mode_choice(other) == mode_choice(plain)
    assert replaced(request, AWKWARD)
    assert replaced(planned, AWKWARD)
    assert plain_request.system_text().startswith(OPENCODE_DEFAULT_START)


async def test_sessions_with_different_prompts_share_one_connection(
    opencode: OpencodeHome,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with opencode.bridge() as run:
            plain = (await run.new())["sessionId"]
            first = (await run.new(text_prompt("append", "MARKER-ONE")))["sessionId"]
            second = (await run.new(text_prompt("override", "MARKER-TWO")))["sessionId"]
            assert len(opencode.processes()) == 3
            seen: dict[str, RecordedRequest] = {}

            async def turn(session: str) -> None:
                seen[session] = await run.turn(session)

            async with trio.open_nursery() as nursery:
                for session in (plain, first, second):
                    nursery.start_soon(turn, session)
            listed = await run.client.request("session/list", {"cwd": opencode.cwd})
    assert "MARKER" not in seen[plain].system_text()
    assert seen[plain].system_text().startswith(OPENCODE_DEFAULT_START)
    assert appended(seen[first], "MARKER-ONE") and "MARKER-TWO" not in seen[first].system_text()
    assert replaced(seen[second], "MARKER-TWO")
    # Every process shares the user's session database: one list has them all.
    assert {plain, first, second} <= {s["sessionId"] for s in listed["sessions"]}


async def test_load_after_a_bridge_restart_keeps_each_sessions_prompt(
    opencode: OpencodeHome,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with opencode.bridge() as run:
            first = (await run.new(text_prompt("append", AWKWARD)))["sessionId"]
            second = (await run.new(text_prompt("override", AWKWARD)))["sessionId"]
            await run.turn(first)
            await run.turn(second)
        assert opencode.processes() == []
        # An editor restart: the prompt is omitted on load and the bridge keeps it.
        async with opencode.bridge() as run:
            await run.reopen("session/load", first)
            loaded = await run.reopen("session/load", second)
            first_again = await run.turn(first)
            second_again = await run.turn(second)
    assert appended(first_again, AWKWARD)
    assert replaced(second_again, AWKWARD)
    assert first_again.user_texts()[0] != first_again.last_user_text()  # history kept
    assert [o["currentValue"] for o in mode_choice(loaded)] == ["build"]


async def test_the_users_own_config_stays_in_force_under_the_bridges_layer(
    opencode: OpencodeHome,
) -> None:
    config_dir = opencode.home / ".config" / "opencode"
    config_dir.mkdir(parents=True)
    own_instructions = opencode.root / "mine.md"
    own_instructions.write_text("USER-INSTRUCTIONS\n")
    own = {"instructions": [str(own_instructions)], "agent": {"build": {"prompt": "USER-BUILD"}}}
    (config_dir / "opencode.json").write_text(json.dumps(own))
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            plain = await run.turn((await run.new())["sessionId"])
            extended = await run.turn(
                (await run.new(text_prompt("append", "MARKER-A")))["sessionId"]
            )
            replaced_by_client = await run.turn(
                (await run.new(text_prompt("override", "MARKER-O")))["sessionId"]
            )
    assert plain.system_text().startswith("USER-BUILD\n")
    # append adds to the user's instructions; override replaces the user's agent prompt too.
    assert extended.system_text().startswith("USER-BUILD\n")
    assert "USER-INSTRUCTIONS" in extended.system_text() and "MARKER-A" in extended.system_text()
    assert replaced(replaced_by_client, "MARKER-O")
    assert "USER-BUILD" not in replaced_by_client.system_text()
    assert "USER-INSTRUCTIONS" in replaced_by_client.system_text()
    # opencode itself adds a "$schema" key to the user's file (without the bridge too).
    after = json.loads((config_dir / "opencode.json").read_text())
    after.pop("$schema", None)
    assert after == own


async def test_empty_override_is_refused_not_replaced_by_opencodes_own(
    opencode: OpencodeHome,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            with pytest.raises(ClientRequestError) as refused:
                await run.new(text_prompt("override", ""))
    assert refused.value.code == -32602
    assert "empty override" in refused.value.error["message"]


async def test_no_opencode_process_outlives_the_client(opencode: OpencodeHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            await run.new(text_prompt("append", "MARKER-A"))
            await run.new(text_prompt("override", "MARKER-O"))
            assert len(opencode.processes()) == 3
        # spawn_bridge closed the bridge's stdin and waited for it to exit.
        assert opencode.processes() == []


async def test_verify_passes_every_step_against_real_opencode(
    opencode_binary: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"agents:\n  opencode:\n    command: {json.dumps(str(opencode_binary))}\n    args: [acp]\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_")}
    env = {
        **agents.clean_agent_env(base),
        "HOME": str(tmp_path),
        "npm_config_registry": "http://127.0.0.1:9/",
    }
    report = await run_verify("--config", str(config), "--agent", "opencode", env=env, timeout=600)
    report.assert_passed()
    assert report.table.count("PASS") == 13, report.table
