"""The goose adapter against a fake goose 1.52.0 (``tests/fake_goose.py``), bridge in process.

Each test drives a real :class:`~acp_bridge.runtime.relay.Bridge` over in-memory streams,
with the fake goose run as a coroutine (``memory_agent.ScriptedAgent``) as its agent, and
asserts what goose holds (``_fake/system_prompt``) and which set calls it received.
Template protection is also checked on its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

# The adapters folder is installed as acp_bridge.adapters through a package-dir mapping,
# which mypy cannot follow.
from acp_bridge.adapters.goose import (  # type: ignore[import-not-found,unused-ignore]
    SET_METHOD,
    GooseAdapter,
    protect_template,
)
from fake_goose import DEFAULT_PROMPT, render
from memory_agent import FAKE_PYTHON, ScriptedSpawner

from acp_bridge.runtime.client import AcpClient, ClientRequestError, connect
from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore

FAKE_GOOSE = Path(__file__).with_name("fake_goose.py")

TIMEOUT = 30.0
TRICKY = 'a {{ x }} b {% if y %} c {# z #} d %} e {% endraw %} f {%- endraw -%} g {%endraw%} "h"'


def text_prompt(mode: str, *texts: str) -> dict[str, Any]:
    return {"mode": mode, "content": [{"type": "text", "text": t} for t in texts]}


@pytest.fixture(autouse=True)
def _provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOSE_PROVIDER", "openai")


class Goose:
    """One bridge process lifetime: client, bridge and where the fake keeps its files."""

    def __init__(self, client: AcpClient, bridge: Bridge, record: Path, cwd: Path) -> None:
        self.client = client
        self.bridge = bridge
        self.record = record
        self.cwd = str(cwd)

    async def new(self, prompt: dict[str, Any] | None = None) -> str:
        params: dict[str, Any] = {"cwd": self.cwd, "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        result = await self.client.request("session/new", params)
        session_id: str = result["sessionId"]
        return session_id

    async def lifecycle(
        self, method: str, session_id: str, prompt: dict[str, Any] | None = None
    ) -> Any:
        params: dict[str, Any] = {"sessionId": session_id, "cwd": self.cwd, "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        return await self.client.request(method, params)

    async def system(self, session_id: str) -> str:
        result = await self.client.request("_fake/system_prompt", {"sessionId": session_id})
        text: str = result["system"]
        return text

    async def sessions(self) -> list[str]:
        result = await self.client.request("session/list", {})
        return [s["sessionId"] for s in result["sessions"]]

    def set_calls(self) -> list[dict[str, Any]]:
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        messages = [json.loads(line) for line in lines]
        return [m["params"] for m in messages if m.get("method") == SET_METHOD]


@asynccontextmanager
async def goose_bridge(
    tmp_path: Path, *fake_args: str, on_omitted: str = "keep"
) -> AsyncIterator[Goose]:
    """The bridge in front of a fake goose; goose's sessions and the bridge's store persist
    in ``tmp_path`` across uses, like a restart of both."""
    argv = [
        *FAKE_PYTHON,
        str(FAKE_GOOSE),
        "acp",
        "--db",
        str(tmp_path / "goose-sessions.json"),
        "--record",
        str(tmp_path / "goose-received.jsonl"),
        *fake_args,
    ]
    client_to_bridge, bridge_in = trio.testing.memory_stream_one_way_pair()
    bridge_out, bridge_to_client = trio.testing.memory_stream_one_way_pair()
    store = SessionStore(tmp_path / "bridge.db")
    try:
        async with trio.open_nursery() as nursery:
            bridge = Bridge(
                BridgeOptions(agent_argv=argv, on_omitted=on_omitted, shutdown_grace=1.0),
                bridge_in,
                bridge_out,
                Lifecycle(store, "goose"),
                spawner=ScriptedSpawner(nursery),
            )
            nursery.start_soon(lambda: bridge.run(watch_signals=False))
            async with connect(client_to_bridge, bridge_to_client) as client:
                with trio.fail_after(TIMEOUT):
                    await client.request("initialize", {"protocolVersion": 1})
                    (tmp_path / "cwd").mkdir(exist_ok=True)
                    yield Goose(client, bridge, tmp_path / "goose-received.jsonl", tmp_path / "cwd")
                await client_to_bridge.aclose()
    finally:
        store.close()


# -------------------------------------------------------------- template protection


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        TRICKY,
        "{%",
        "{% raw %}",
        "ends with {",
        "{{%",
        "%}{%}",
        "\n  leading and trailing  \n",
    ],
)
def test_protected_template_renders_to_the_text(text: str) -> None:
    assert render(protect_template(text)) == text


def test_protected_template_keeps_block_starts_out_of_raw_blocks() -> None:
    protected = protect_template("x {% endraw %} y")
    assert protected == '{% raw %}x {% endraw %}{{ "{%" }}{% raw %} endraw %} y{% endraw %}'


# ------------------------------------------------------------------- advertising


async def test_fork_advertised_but_not_resume(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        result = await goose.client.request("initialize", {"protocolVersion": 1})
    session_caps = result["agentCapabilities"]["sessionCapabilities"]
    assert session_caps["fork"] == {}
    assert "resume" not in session_caps
    assert session_caps["systemPrompt"] == {"mode": {"override": {}}}
    assert result["agentCapabilities"]["_meta"]["acp-bridge"]["adapter"] == "goose"


def test_goose_detected_by_agent_name() -> None:
    assert GooseAdapter.detect({"agentInfo": {"name": "goose", "version": "1.52.0"}})
    assert not GooseAdapter.detect({"agentInfo": {"name": "codex-acp"}})


# ---------------------------------------------------------------- session/new


async def test_append_sets_the_bridge_key_before_the_client_gets_the_session(
    tmp_path: Path,
) -> None:
    async with goose_bridge(tmp_path) as goose:
        session = await goose.new(text_prompt("append", "MARKER-A", "second block"))
        assert goose.set_calls() == [
            {
                "sessionId": session,
                "mode": "append",
                "key": "acp-bridge",
                "text": "MARKER-A\n\nsecond block",
            }
        ]
        system = await goose.system(session)
    assert system.startswith(DEFAULT_PROMPT)
    assert system.endswith("# Additional Instructions:\n\nMARKER-A\n\nsecond block")


async def test_override_replaces_the_base_prompt_verbatim(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        session = await goose.new(text_prompt("override", TRICKY))
        assert [c["mode"] for c in goose.set_calls()] == ["set"]
        assert await goose.system(session) == TRICKY


async def test_without_a_prompt_nothing_is_set(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        session = await goose.new()
        assert goose.set_calls() == []
        assert await goose.system(session) == DEFAULT_PROMPT


async def test_blank_override_rejected_without_creating_a_session(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        with pytest.raises(ClientRequestError) as raised:
            await goose.new(text_prompt("override", "  \n"))
        assert raised.value.code == -32602
        assert await goose.sessions() == []


async def test_refused_set_deletes_the_new_session_and_fails(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path, "--refuse-set", "append") as goose:
        with pytest.raises(ClientRequestError) as raised:
            await goose.new(text_prompt("append", "MARKER"))
        assert raised.value.code == -32603
        assert raised.value.error["data"]["agentError"]["data"] == "append refused by the fake"
        assert await goose.sessions() == []
        assert goose.bridge.lifecycle.store.list(goose.bridge.lifecycle.agent) == []


async def test_refused_set_falls_back_to_close_when_delete_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with goose_bridge(tmp_path, "--refuse-set", "set", "--refuse-delete") as goose:
        with pytest.raises(ClientRequestError):
            await goose.new(text_prompt("override", "X"))
        methods = [json.loads(line).get("method") for line in goose.record.read_text().splitlines()]
    assert methods[-2:] == ["session/delete", "session/close"]
    assert "session/delete failed" in caplog.text


async def test_goose_exiting_on_set_fails_the_request(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path, "--exit-on-set") as goose:
        response = await goose.client.request_raw(
            "session/new",
            {"cwd": goose.cwd, "mcpServers": [], "systemPrompt": text_prompt("append", "M")},
        )
    assert response["error"]["code"] == -32603


# ------------------------------------------------------------------ session/load


async def test_load_after_close_reapplies_the_stored_prompt(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        session = await goose.new(text_prompt("override", "STORED"))
        await goose.client.request("session/close", {"sessionId": session})
        await goose.lifecycle("session/load", session)
        assert await goose.system(session) == "STORED"


async def test_load_after_restart_reapplies_the_stored_prompt(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        session = await goose.new(text_prompt("append", "KEPT"))
    async with goose_bridge(tmp_path) as goose:
        await goose.lifecycle("session/load", session)
        assert (await goose.system(session)).endswith("\n\nKEPT")


async def test_load_after_restart_with_on_omitted_default_keeps_goose_default(
    tmp_path: Path,
) -> None:
    async with goose_bridge(tmp_path) as goose:
        session = await goose.new(text_prompt("override", "GONE"))
        calls = len(goose.set_calls())
    async with goose_bridge(tmp_path, on_omitted="default") as goose:
        await goose.lifecycle("session/load", session)
        assert len(goose.set_calls()) == calls
        assert await goose.system(session) == DEFAULT_PROMPT


async def test_load_with_default_policy_clears_a_prompt_goose_still_holds(
    tmp_path: Path,
) -> None:
    async with goose_bridge(tmp_path, on_omitted="default") as goose:
        session = await goose.new(text_prompt("append", "HELD"))
        await goose.lifecycle("session/load", session)
        assert await goose.system(session) == DEFAULT_PROMPT


async def test_switching_append_to_override_clears_the_appended_text(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        session = await goose.new(text_prompt("append", "OLD-APPEND"))
        await goose.lifecycle("session/load", session, text_prompt("override", "NEW-BASE"))
        assert await goose.system(session) == "NEW-BASE"
        await goose.lifecycle("session/load", session, text_prompt("append", "AGAIN"))
        assert (
            await goose.system(session)
            == f"{DEFAULT_PROMPT}\n\n# Additional Instructions:\n\nAGAIN"
        )


async def test_refused_set_on_load_closes_but_keeps_the_session(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        session = await goose.new()
    async with goose_bridge(tmp_path, "--refuse-set", "append") as goose:
        with pytest.raises(ClientRequestError):
            await goose.lifecycle("session/load", session, text_prompt("append", "X"))
        methods = [json.loads(line).get("method") for line in goose.record.read_text().splitlines()]
        assert methods[-1] == "session/close"
        assert await goose.sessions() == [session]


# ------------------------------------------------------------------ session/fork


async def test_fork_inherits_the_parent_prompt(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        parent = await goose.new(text_prompt("override", "PARENT"))
        forked = await goose.lifecycle("session/fork", parent)
        child = forked["sessionId"]
        assert child != parent
        assert await goose.system(child) == "PARENT"


async def test_fork_with_its_own_prompt(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        parent = await goose.new(text_prompt("override", "PARENT"))
        forked = await goose.lifecycle("session/fork", parent, text_prompt("append", "CHILD"))
        assert (await goose.system(forked["sessionId"])).endswith("\n\nCHILD")
        assert await goose.system(parent) == "PARENT"


async def test_refused_set_on_fork_deletes_the_fork(tmp_path: Path) -> None:
    async with goose_bridge(tmp_path) as goose:
        parent = await goose.new()
    async with goose_bridge(tmp_path, "--refuse-set", "set") as goose:
        with pytest.raises(ClientRequestError):
            await goose.lifecycle("session/fork", parent, text_prompt("override", "X"))
        assert await goose.sessions() == [parent]


# ------------------------------------------------------------------ diagnostics


async def test_trimmed_override_whitespace_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with goose_bridge(tmp_path) as goose:
        await goose.new(text_prompt("override", "  padded\n"))
    assert "trims leading and trailing whitespace" in caplog.text
