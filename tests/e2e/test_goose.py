"""goose 1.52.0 through the bridge, end to end, against the embedded model endpoint.

The real goose binary (npm ``@aaif/goose-binary-linux-x64``, cached by ``tests/agents.py``)
runs behind the real bridge command line (``python -m acp_bridge --state FILE -- goose acp``)
with its provider pointed at the endpoint's OpenAI Chat Completions flavour. Every test
asserts the system message the model actually received on a ``session/prompt``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import agents
import pytest
import trio
from acp_requests import prompt_params, text_prompt
from agent_home import AgentHome, BridgeRun, open_agent_home
from bridge_cli import isolated_env
from conftest import run_verify

from acp_bridge.runtime.client import ClientRequestError, spawn_bridge
from acp_bridge.state.store import SessionStore

pytestmark = pytest.mark.e2e

# Opening line of goose 1.52.0's own system prompt; absent once an override replaces it.
GOOSE_DEFAULT_OPENING = "You are a general-purpose AI agent called goose, created by AAIF"
ADDITIONAL = "\n\n# Additional Instructions:\n\n"
# Everything MiniJinja would interpret or choke on, including every way to end a raw block.
TEMPLATE_TEXT = (
    "TEMPLATE-MARKER {{ current_date_time }} {{ goose_mode }} {% if broken %} {# note #}\n"
    "{% raw %}inner{% endraw %} {%endraw%} {%- endraw -%} }} %} {{% {\n"
    "quotes \"double\" and 'single', a backslash \\ and <html>&amp;"
)
TIMEOUT = 120.0
# The goose and OpenAI settings of the machine running the tests.
USER_SETTINGS = ("GOOSE_", "OPENAI_")


class GooseHome(AgentHome):
    """One isolated goose installation: HOME, XDG dirs, goose's session database."""

    def env(self) -> dict[str, str]:
        settings = {
            "GOOSE_PROVIDER": "openai",
            "GOOSE_MODEL": "fake-model",
            "OPENAI_HOST": self.endpoint.url,
            "OPENAI_API_KEY": "sk-fake",
            "GOOSE_DISABLE_KEYRING": "1",
            "GOOSE_TELEMETRY_ENABLED": "false",
            "GOOSE_DISABLE_SESSION_NAMING": "true",
            "GOOSE_MODE": "auto",
        }
        return self.agent_env(USER_SETTINGS, settings)

    def agent_argv(self) -> list[str]:
        return [str(self.binary), "acp"]


class Run(BridgeRun):
    """One bridge (and goose) process lifetime, seen from the client."""

    async def close(self, session_id: str) -> None:
        await self.client.request("session/close", {"sessionId": session_id})

    async def sessions(self) -> list[str]:
        result = await self.client.request("session/list", {})
        return [session["sessionId"] for session in result["sessions"]]

    async def system(self, session_id: str) -> str:
        """Prompt the session once; the system message the model received for that turn."""
        seen = len(self.home.endpoint.main_requests("openai-chat"))
        await self.client.request("session/prompt", prompt_params(session_id, "hello"))
        requests = await self.home.endpoint.wait_for_requests(seen + 1, flavour="openai-chat")
        return requests[seen].system_text()


@pytest.fixture(scope="session")
def goose_binary() -> Path:
    return agents.goose_binary()


@pytest.fixture
async def goose_home(goose_binary: Path, tmp_path: Path) -> AsyncIterator[GooseHome]:
    async with open_agent_home(GooseHome, goose_binary, tmp_path) as home:
        yield home


@asynccontextmanager
async def bridge(home: GooseHome, *options: str) -> AsyncIterator[Run]:
    """``acp-bridge [OPTIONS] -- goose acp`` as a subprocess, initialized."""
    with trio.fail_after(TIMEOUT):
        async with spawn_bridge(home.command(*options), env=home.env()) as (client, _process):
            initialize = await client.request(
                "initialize", {"protocolVersion": 1, "clientCapabilities": {}}
            )
            yield Run(client, initialize, home)


# ----------------------------------------------------------------------- advertising


async def test_bridge_advertises_append_override_and_fork_for_goose(
    goose_home: GooseHome,
) -> None:
    async with bridge(goose_home) as run:
        caps = run.initialize["agentCapabilities"]
    assert caps["sessionCapabilities"]["systemPrompt"] == {"mode": {"override": {}}}
    assert caps["sessionCapabilities"]["fork"] == {}
    assert "resume" not in caps["sessionCapabilities"]
    assert caps["_meta"]["acp-bridge"]["adapter"] == "goose"
    assert run.initialize["agentInfo"] == {"name": "goose", "version": "1.52.0"}


# ----------------------------------------------------------------------- session/new


async def test_append_on_new_keeps_goose_default_and_adds_the_marker(
    goose_home: GooseHome,
) -> None:
    async with bridge(goose_home) as run:
        session = await run.new(text_prompt("append", "APPEND-MARKER-1", "second block"))
        system = await run.system(session)
    assert system.startswith(GOOSE_DEFAULT_OPENING)
    assert system.endswith(f"{ADDITIONAL}APPEND-MARKER-1\n\nsecond block")


async def test_override_on_new_replaces_goose_default(goose_home: GooseHome) -> None:
    async with bridge(goose_home) as run:
        session = await run.new(text_prompt("override", "OVERRIDE-MARKER-1", "second block"))
        system = await run.system(session)
    assert system == "OVERRIDE-MARKER-1\n\nsecond block"


async def test_session_without_prompt_gets_goose_default(goose_home: GooseHome) -> None:
    async with bridge(goose_home) as run:
        session = await run.new()
        system = await run.system(session)
    assert system.startswith(GOOSE_DEFAULT_OPENING)
    assert "# Additional Instructions:" not in system


async def test_templates_and_braces_reach_the_model_verbatim_in_an_override(
    goose_home: GooseHome,
) -> None:
    async with bridge(goose_home) as run:
        session = await run.new(text_prompt("override", TEMPLATE_TEXT))
        system = await run.system(session)
    assert system == TEMPLATE_TEXT


async def test_templates_and_braces_reach_the_model_verbatim_when_appended(
    goose_home: GooseHome,
) -> None:
    async with bridge(goose_home) as run:
        session = await run.new(text_prompt("append", TEMPLATE_TEXT))
        system = await run.system(session)
    assert system.startswith(GOOSE_DEFAULT_OPENING)
    assert system.endswith(ADDITIONAL + TEMPLATE_TEXT)


# ---------------------------------------------------------------------- session/load


@pytest.mark.parametrize("resend", [True, False], ids=["re-sent", "omitted"])
async def test_load_after_close_restores_the_prompt(goose_home: GooseHome, resend: bool) -> None:
    prompt = text_prompt("append", "RELOAD-MARKER")
    async with bridge(goose_home) as run:
        session = await run.new(prompt)
        await run.close(session)
        await run.reopen("session/load", session, prompt if resend else None)
        system = await run.system(session)
    assert system.startswith(GOOSE_DEFAULT_OPENING)
    assert system.endswith(f"{ADDITIONAL}RELOAD-MARKER")
    assert system.count("RELOAD-MARKER") == 1


@pytest.mark.parametrize("resend", [True, False], ids=["re-sent", "omitted"])
async def test_load_after_restart_restores_the_prompt(goose_home: GooseHome, resend: bool) -> None:
    prompt = text_prompt("override", "RESTART-MARKER")
    async with bridge(goose_home) as run:
        session = await run.new(prompt)
        assert await run.system(session) == "RESTART-MARKER"
    async with bridge(goose_home) as run:
        await run.reopen("session/load", session, prompt if resend else None)
        system = await run.system(session)
    assert system == "RESTART-MARKER"


async def test_load_after_restart_with_on_omitted_default_gets_goose_default(
    goose_home: GooseHome,
) -> None:
    async with bridge(goose_home) as run:
        session = await run.new(text_prompt("override", "DROPPED-MARKER"))
        assert await run.system(session) == "DROPPED-MARKER"
    async with bridge(goose_home, "--on-omitted", "default") as run:
        await run.reopen("session/load", session)
        system = await run.system(session)
    assert system.startswith(GOOSE_DEFAULT_OPENING)
    assert "DROPPED-MARKER" not in system


async def test_load_with_a_changed_mode_clears_the_old_slot(goose_home: GooseHome) -> None:
    async with bridge(goose_home) as run:
        session = await run.new(text_prompt("append", "FIRST-APPEND"))
        await run.reopen("session/load", session, text_prompt("override", "THEN-OVERRIDE"))
        assert await run.system(session) == "THEN-OVERRIDE"
        await run.reopen("session/load", session, text_prompt("append", "THEN-APPEND"))
        system = await run.system(session)
    assert system.startswith(GOOSE_DEFAULT_OPENING)
    assert system.endswith(f"{ADDITIONAL}THEN-APPEND")
    assert "FIRST-APPEND" not in system
    assert "THEN-OVERRIDE" not in system


# ---------------------------------------------------------------------- session/fork


async def test_fork_inherits_the_parent_prompt(goose_home: GooseHome) -> None:
    async with bridge(goose_home) as run:
        parent = await run.new(text_prompt("override", "FORK-PARENT-MARKER"))
        child = (await run.reopen("session/fork", parent))["sessionId"]
        assert child != parent
        child_system = await run.system(child)
        parent_system = await run.system(parent)
    assert child_system == "FORK-PARENT-MARKER"
    assert parent_system == "FORK-PARENT-MARKER"


async def test_fork_with_its_own_prompt_leaves_the_parent_alone(goose_home: GooseHome) -> None:
    async with bridge(goose_home) as run:
        parent = await run.new(text_prompt("override", "FORK-PARENT"))
        forked = await run.reopen("session/fork", parent, text_prompt("append", "FORK-CHILD"))
        child_system = await run.system(forked["sessionId"])
        parent_system = await run.system(parent)
    assert child_system.startswith(GOOSE_DEFAULT_OPENING)
    assert child_system.endswith(f"{ADDITIONAL}FORK-CHILD")
    assert parent_system == "FORK-PARENT"


# ------------------------------------------------------------------------ a failing set

# goose refuses an append whose key is blank ("key cannot be empty for append mode"); a
# user adapter that uses such a key makes the real goose refuse the set call.
BLANK_KEY_ADAPTER = """
from acp_bridge.adapters.goose import GooseAdapter


class BlankKeyGooseAdapter(GooseAdapter):
    name = "goose-blank-key"
    append_key = " "
"""


async def test_refused_set_leaves_no_session_and_fails_the_request(
    goose_home: GooseHome,
) -> None:
    folder = goose_home.root / "user-adapters"
    folder.mkdir()
    (folder / "blank_key.py").write_text(BLANK_KEY_ADAPTER)
    config = goose_home.root / "config.yaml"
    config.write_text(f"bridge:\n  adapter_paths: [{str(folder)!r}]\n")
    trace = goose_home.root / "trace.jsonl"
    options = ("--config", str(config), "--adapter", "goose-blank-key", "--trace", str(trace))
    async with bridge(goose_home, *options) as run:
        with pytest.raises(ClientRequestError) as raised:
            await run.new(text_prompt("append", "REFUSED-MARKER"))
        # The session goose created for the request, as the trace saw it.
        frames = [json.loads(line) for line in trace.read_text().splitlines()]
        created = [
            f["frame"]["result"]["sessionId"]
            for f in frames
            if f["dir"] == "agent->bridge" and "sessionId" in (f["frame"].get("result") or {})
        ]
        assert len(created) == 1
        sent = [f["frame"] for f in frames if f["dir"] == "bridge->agent"]
        assert sent[-1]["method"] == "session/delete"
        assert sent[-1]["params"] == {"sessionId": created[0]}
        with pytest.raises(ClientRequestError) as load_refused:
            await run.reopen("session/load", created[0])
        assert load_refused.value.code == -32002
        assert await run.sessions() == []
        # Without a prompt nothing is set, so the same adapter creates sessions fine.
        session = await run.new()
        system = await run.system(session)
        assert await run.sessions() == [session]
    agent_error = raised.value.error["data"]["agentError"]
    assert agent_error["code"] == -32602
    assert agent_error["data"] == "key cannot be empty for append mode"
    assert "REFUSED-MARKER" not in system
    store = SessionStore(goose_home.state)
    try:
        assert [record.session_id for record in store.list()] == [session]
    finally:
        store.close()
    assert all("REFUSED-MARKER" not in r.system_text() for r in goose_home.endpoint.requests)


# ------------------------------------------------------------------------------ verify


async def test_verify_passes_for_the_goose_preset(goose_binary: Path, tmp_path: Path) -> None:
    env = isolated_env(
        tmp_path,
        without=USER_SETTINGS,
        GOOSE_BINARY=str(goose_binary),
        XDG_CONFIG_HOME=str(tmp_path / ".config"),
        XDG_STATE_HOME=str(tmp_path / ".local" / "state"),
    )
    report = await run_verify("--agent", "goose", env=env, timeout=TIMEOUT)
    report.assert_passed()
