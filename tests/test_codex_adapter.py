"""The codex adapter against ``tests/fake_codex.py``: several processes behind one connection.

The bridge runs in this process (memory streams to the client); every codex process is a
real subprocess that records what it received, so the tests assert on which process got
which message.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

# The adapters folder is installed as acp_bridge.adapters through a package-dir mapping,
# which mypy cannot follow.
from acp_bridge.adapters import codex as codex_module  # type: ignore[attr-defined,unused-ignore]
from acp_bridge.adapters.codex import (  # type: ignore[import-not-found,unused-ignore]
    CodexAdapter,
    reopen_effect,
    toml_string,
    user_codex_config,
)
from adapter_context import ContextWithEnvironment, Primary
from conftest import pid_alive
from memory_agent import FAKE_PYTHON

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PromptRefused
from acp_bridge.runtime.client import AcpClient, ClientRequestError
from acp_bridge.runtime.embedded import open_embedded_bridge
from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import Kind

FAKE_CODEX = Path(__file__).with_name("fake_codex.py")
TIMEOUT = 20.0


def append(text: str) -> dict[str, Any]:
    return {"mode": "append", "content": [{"type": "text", "text": text}]}


def override(text: str) -> dict[str, Any]:
    return {"mode": "override", "content": [{"type": "text", "text": text}]}


@dataclass
class Harness:
    client: AcpClient
    bridge: Bridge
    records: Path

    def pids(self) -> list[int]:
        return sorted(int(p.stem) for p in self.records.glob("*.jsonl"))

    def received(self, pid: int) -> list[dict[str, Any]]:
        lines = (self.records / f"{pid}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines[1:]]

    def overrides(self, pid: int) -> dict[str, str]:
        first = (self.records / f"{pid}.jsonl").read_text().splitlines()[0]
        overrides: dict[str, str] = json.loads(first)["overrides"]
        return overrides

    def methods(self, pid: int) -> list[str]:
        return [m["method"] for m in self.received(pid) if "method" in m]

    @property
    def adapter(self) -> CodexAdapter:
        assert isinstance(self.bridge.adapter, CodexAdapter)
        return self.bridge.adapter

    async def new(self, prompt: dict[str, Any] | None = None) -> str:
        params: dict[str, Any] = {"cwd": str(self.records), "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        result = await self.client.request("session/new", params)
        session_id: str = result["sessionId"]
        return session_id

    async def served_by(self, session_id: str, text: str = "hi") -> dict[str, Any]:
        """Prompt the session; the identity of the process that answered."""
        before = len(self.client.updates(session_id))
        await self.client.request(
            "session/prompt",
            {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
        )
        chunk = self.client.updates(session_id)[before]
        identity: dict[str, Any] = json.loads(chunk["content"]["text"])
        return identity


@asynccontextmanager
async def codex_bridge(
    tmp_path: Path, *, agent_env: dict[str, str] | None = None, **codex_options: Any
) -> AsyncIterator[Harness]:
    """The bridge in front of the fake codex-acp, initialized; ``agent_env`` is the
    configured agent environment and ``codex_options`` the adapter's options."""
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    options = BridgeOptions(
        agent_argv=[*FAKE_PYTHON, str(FAKE_CODEX), "--record-dir", str(records)],
        agent_env=agent_env or {},
        shutdown_grace=0.3,
        adapter_options={"codex": codex_options},
    )
    with trio.fail_after(TIMEOUT):
        async with open_embedded_bridge(options, SessionStore(":memory:")) as embedded:
            await embedded.client.request("initialize", {"protocolVersion": 1})
            yield Harness(embedded.client, embedded.bridge, records)


async def wait_until_gone(pid: int) -> None:
    while pid_alive(pid):
        await trio.sleep(0.02)


# --------------------------------------------------------------------------- pure parts


def test_toml_string_escapes_what_toml_forbids_and_keeps_the_rest() -> None:
    text = 'line 1\n"quoted" \\ tab\t emoji \U0001f600 del\x7f nul\x00'
    encoded = toml_string(text)
    assert "\x7f" not in encoded and "\x00" not in encoded
    assert "\U0001f600" in encoded
    assert json.loads(encoded) == text


def test_reopen_effect_names_what_codex_cannot_change() -> None:
    dev_a = SystemPrompt.of_text("append", "A")
    dev_b = SystemPrompt.of_text("append", "B")
    base_o = SystemPrompt.of_text("override", "O")
    base_p = SystemPrompt.of_text("override", "P")
    assert reopen_effect(dev_a, dev_a) == []
    assert reopen_effect(base_o, base_p) == []  # an explicit override replaces the stored one
    assert reopen_effect(None, base_o) == []
    assert any("not added" in p for p in reopen_effect(dev_a, dev_b))
    assert any("not added" in p for p in reopen_effect(None, dev_a))
    assert any("stays in its history" in p for p in reopen_effect(dev_a, None))
    assert any("stays in its history" in p for p in reopen_effect(dev_a, base_o))
    assert any("base instructions" in p for p in reopen_effect(base_o, None))


# ----------------------------------------------------------------------------- routing


async def test_each_distinct_prompt_gets_its_own_process(tmp_path: Path) -> None:
    async with codex_bridge(tmp_path) as h:
        plain = await h.new()
        first = await h.new(append("be brief"))
        second = await h.new(append("be brief"))
        replaced = await h.new(override("You are a pirate."))

        plain_id = await h.served_by(plain)
        first_id = await h.served_by(first)
        second_id = await h.served_by(second)
        replaced_id = await h.served_by(replaced)

    assert plain_id == {"developer": None, "base": None, "pid": h.pids()[0]}
    assert first_id["developer"] == "be brief" and first_id["base"] is None
    assert second_id["pid"] == first_id["pid"]
    assert replaced_id["base"] == "You are a pirate." and replaced_id["developer"] is None
    assert len({plain_id["pid"], first_id["pid"], replaced_id["pid"]}) == 3
    # Every process got the client's initialize, replayed by the bridge.
    for pid in h.pids():
        assert h.methods(pid)[0] == "initialize"


async def test_session_scoped_messages_reach_the_process_holding_the_session(
    tmp_path: Path,
) -> None:
    async with codex_bridge(tmp_path) as h:
        session = await h.new(append("rules"))
        pid = (await h.served_by(session))["pid"]
        primary = h.bridge.primary.process.pid

        async with trio.open_nursery() as nursery:
            outcome: dict[str, Any] = {}

            async def hang() -> None:
                outcome["result"] = await h.client.request(
                    "session/prompt",
                    {"sessionId": session, "prompt": [{"type": "text", "text": "hang"}]},
                )

            nursery.start_soon(hang)
            while "hang" not in json.dumps(h.received(pid)[-1]):
                await trio.sleep(0.01)
            await h.client.notify("session/cancel", {"sessionId": session})

        assert outcome["result"] == {"stopReason": "cancelled"}
    assert "session/cancel" in h.methods(pid)
    assert "session/cancel" not in h.methods(primary)
    assert "session/prompt" not in h.methods(primary)


async def test_cancel_request_reaches_the_process_running_the_request(tmp_path: Path) -> None:
    async with codex_bridge(tmp_path) as h:
        session = await h.new(append("rules"))
        pid = (await h.served_by(session))["pid"]
        primary = h.bridge.primary.process.pid
        request = jsonrpc.request(
            "prompt-7",
            "session/prompt",
            {"sessionId": session, "prompt": [{"type": "text", "text": "hang"}]},
        )
        await h.client.send_message(request)
        while "hang" not in json.dumps(h.received(pid)[-1]):
            await trio.sleep(0.01)
        await h.client.notify("$/cancel_request", {"requestId": "prompt-7"})
        await h.client.notify("session/cancel", {"sessionId": session})
        while "session/cancel" not in h.methods(pid):
            await trio.sleep(0.01)

    cancels = [m for m in h.received(pid) if m.get("method") == "$/cancel_request"]
    assert cancels == [
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "prompt-7"}}
    ]
    assert "$/cancel_request" not in h.methods(primary)


class HoldingClient(AcpClient):
    """Keeps the agent's requests unanswered until the test answers them."""

    async def _dispatch(self, raw: bytes) -> None:
        frame = jsonrpc.parse(raw)
        if frame.kind is Kind.REQUEST:
            self.agent_requests.append(frame.message)
        else:
            await super()._dispatch(raw)


async def test_agent_requests_from_two_processes_get_distinct_client_ids(
    tmp_path: Path,
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    options = BridgeOptions(
        agent_argv=[*FAKE_PYTHON, str(FAKE_CODEX), "--record-dir", str(records)],
        shutdown_grace=0.3,
    )
    client_stream, bridge_stream = trio.testing.memory_stream_pair()
    bridge = Bridge(options, bridge_stream, bridge_stream, Lifecycle(SessionStore(":memory:"), "x"))
    client = HoldingClient(client_stream, client_stream)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(bridge.run, watch_signals=False))
            nursery.start_soon(client.serve)
            await client.request("initialize", {"protocolVersion": 1})
            h = Harness(client, bridge, records)
            plain = await h.new()
            prompted = await h.new(append("rules"))
            results: dict[str, Any] = {}

            async def ask(session_id: str) -> None:
                results[session_id] = await client.request(
                    "session/prompt",
                    {"sessionId": session_id, "prompt": [{"type": "text", "text": "ask"}]},
                )

            nursery.start_soon(ask, plain)
            nursery.start_soon(ask, prompted)
            while len(client.agent_requests) < 2:
                await trio.sleep(0.01)
            ids = [r["id"] for r in client.agent_requests]
            assert len(set(ids)) == 2 and 0 in ids
            # Each process's $/cancel_request names the id the client saw.
            while len([n for n in client.notifications if n["method"] == "$/cancel_request"]) < 2:
                await trio.sleep(0.01)
            cancelled = [
                n["params"]["requestId"]
                for n in client.notifications
                if n["method"] == "$/cancel_request"
            ]
            assert sorted(cancelled, key=str) == sorted(ids, key=str)
            for request in client.agent_requests:
                answer = {"content": f"for {request['params']['sessionId']}"}
                await client.send_message(jsonrpc.result_response(request["id"], answer))
            while len(results) < 2:
                await trio.sleep(0.01)
            await client_stream.aclose()

    assert results == {plain: {"stopReason": "end_turn"}, prompted: {"stopReason": "end_turn"}}
    for pid in h.pids():
        answers = [m for m in h.received(pid) if "method" not in m]
        # Each process got its answer under the id it used itself, 0.
        assert len(answers) == 1 and answers[0]["id"] == 0
        session = answers[0]["result"]["content"].removeprefix("for ")
        assert any(m.get("params", {}).get("sessionId") == session for m in h.received(pid))


async def test_session_list_is_answered_once_by_the_primary(tmp_path: Path) -> None:
    async with codex_bridge(tmp_path) as h:
        await h.new(append("one"))
        await h.new(override("two"))
        listed = await h.client.request("session/list", {})
        primary = h.bridge.primary.process.pid
    assert listed["answeredBy"] == primary
    assert [pid for pid in h.pids() if "session/list" in h.methods(pid)] == [primary]


async def test_load_moves_a_live_session_to_its_prompts_process(tmp_path: Path) -> None:
    async with codex_bridge(tmp_path) as h:
        session = await h.new(append("old rules"))
        old_pid = (await h.served_by(session))["pid"]
        await h.client.request(
            "session/load",
            {"sessionId": session, "cwd": "/", "mcpServers": [], "systemPrompt": append("new")},
        )
        moved = await h.served_by(session)
        await h.client.request("session/resume", {"sessionId": session, "cwd": "/"})
        kept = await h.served_by(session)
    assert moved["developer"] == "new" and moved["pid"] != old_pid
    assert kept["pid"] == moved["pid"]  # on_omitted keep: the stored prompt's process
    old = h.received(old_pid)
    assert {"method": "session/close", "sessionId": session} in [
        {"method": m.get("method"), "sessionId": m.get("params", {}).get("sessionId")} for m in old
    ]


async def test_load_without_a_known_session_starts_the_prompts_process(tmp_path: Path) -> None:
    async with codex_bridge(tmp_path) as h:
        await h.client.request(
            "session/load",
            {
                "sessionId": "from-disk",
                "cwd": "/",
                "mcpServers": [],
                "systemPrompt": override("base"),
            },
        )
        identity = await h.served_by("from-disk")
    assert identity["base"] == "base"


# --------------------------------------------------------------------- process lifetime


async def test_a_process_without_live_sessions_is_stopped_after_the_idle_timeout(
    tmp_path: Path,
) -> None:
    async with codex_bridge(tmp_path, idle_timeout=0.2) as h:
        session = await h.new(override("short-lived"))
        pid = (await h.served_by(session))["pid"]
        key = SystemPrompt.from_wire(override("short-lived")).fingerprint()
        pooled = h.adapter.processes.by_key[key]
        assert pooled.private is not None
        path = pooled.private.path / "instructions.md"
        assert path.exists()
        await trio.sleep(0.4)
        assert pid_alive(pid)  # a live session keeps it running
        await h.client.request("session/close", {"sessionId": session})
        # The pool removes the files once the stop is complete (the process reaped and its
        # output read to the end), a moment after the pid is gone: within the same bound.
        with trio.fail_after(5):
            await wait_until_gone(pid)
            while path.exists():
                await trio.sleep(0.02)
        # The prompt is used again: a fresh process serves it.
        again = await h.new(override("short-lived"))
        assert (await h.served_by(again))["pid"] != pid


async def test_override_instructions_file_is_private_to_the_user(tmp_path: Path) -> None:
    async with codex_bridge(tmp_path) as h:
        await h.new(override("secret persona"))
        (pooled,) = [p for key, p in h.adapter.processes.by_key.items() if key is not None]
        assert pooled.private is not None
        path = pooled.private.path / "instructions.md"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.read_text() == "secret persona"
    assert not path.exists() and not path.parent.exists()


async def test_past_the_process_limit_session_new_gets_a_clear_error(tmp_path: Path) -> None:
    async with codex_bridge(tmp_path, max_processes=2) as h:
        first = await h.new(append("one"))
        with pytest.raises(ClientRequestError) as refused:
            await h.new(append("two"))
        assert refused.value.code == -32029  # at capacity (pool.AT_CAPACITY)
        assert "at most 2 codex-acp processes" in refused.value.error["message"]
        assert refused.value.error["data"] == {"maxProcesses": 2}
        assert len(h.pids()) == 2
        # Once the first prompt's process holds no session, it makes room.
        await h.client.request("session/close", {"sessionId": first})
        second = await h.new(append("two"))
        assert (await h.served_by(second))["developer"] == "two"
        assert sum(pid_alive(pid) for pid in h.pids()) == 2


async def test_no_process_is_left_after_the_client_disconnects(tmp_path: Path) -> None:
    async with codex_bridge(tmp_path) as h:
        await h.new()
        await h.new(append("one"))
        await h.new(override("two"))
        pids = h.pids()
        assert len(pids) == 3 and all(pid_alive(pid) for pid in pids)
    assert not any(pid_alive(pid) for pid in pids)


async def test_invalid_adapter_options_fail_initialize(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    options = BridgeOptions(
        agent_argv=[*FAKE_PYTHON, str(FAKE_CODEX), "--record-dir", str(records)],
        shutdown_grace=0.3,
        adapter_options={"codex": {"idle_timout": 1}},
    )
    with trio.fail_after(TIMEOUT):
        async with open_embedded_bridge(options, SessionStore(":memory:")) as embedded:
            with pytest.raises(ClientRequestError) as failed:
                await embedded.client.request("initialize", {"protocolVersion": 1})
    assert "idle_timout" in json.dumps(failed.value.error)


def test_fake_codex_is_detected_as_codex() -> None:
    assert CodexAdapter.detect({"agentInfo": {"name": "codex-acp"}})
    assert not CodexAdapter.detect({"agentInfo": {"name": "goose"}})
    assert os.path.exists(FAKE_CODEX)


async def test_load_right_after_close_waits_for_codex_to_release_the_session(
    tmp_path: Path,
) -> None:
    # The fake, like codex-acp, refuses a reopen for a moment after session/close.
    async with codex_bridge(tmp_path) as h:
        session = await h.new(append("rules"))
        await h.client.request("session/close", {"sessionId": session})
        params = {
            "sessionId": session,
            "cwd": "/",
            "mcpServers": [],
            "systemPrompt": append("rules"),
        }
        assert await h.client.request("session/load", params) == {}
        served = await h.served_by(session)
    assert served["developer"] == "rules"
    loads = [m for m in h.received(served["pid"]) if m.get("method") == "session/load"]
    assert len(loads) >= 2  # the first attempt was refused, a retry succeeded


# ------------------------------------------------------- append prompt off the command line


@pytest.fixture
def relay_tells_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay's AdapterContext.agent_environment(): the bridge's environment plus the
    configured agent environment, as agent processes get it."""

    def agent_environment(self: Bridge) -> dict[str, str]:
        return {**os.environ, **self.options.agent_env}

    monkeypatch.setattr(Bridge, "agent_environment", agent_environment, raising=False)


async def test_append_prompt_goes_to_a_private_codex_home_not_argv(
    tmp_path: Path, relay_tells_environment: None
) -> None:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text('model = "gpt-5.4"\n\n[features]\nx = true\n')
    (home / "auth.json").write_text("{}")
    async with codex_bridge(tmp_path, agent_env={"CODEX_HOME": str(home)}) as h:
        session = await h.new(append('secret "rules"\nline two'))
        identity = await h.served_by(session)
        (pooled,) = [p for key, p in h.adapter.processes.by_key.items() if key is not None]
        assert pooled.private is not None
        private = pooled.private.path
        assert private.parent == home
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        config = private / "config.toml"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert config.read_text().endswith('model = "gpt-5.4"\n\n[features]\nx = true\n')
        assert (private / "auth.json").resolve() == home / "auth.json"
        assert (private / "sessions").resolve() == home / "sessions"
    assert identity["developer"] == 'secret "rules"\nline two'
    assert h.overrides(identity["pid"]) == {}  # nothing on its command line
    assert not private.exists()
    assert sorted(p.name for p in home.iterdir()) == [
        "archived_sessions",
        "auth.json",
        "config.toml",
        "sessions",
    ]


async def test_a_users_own_developer_instructions_keep_the_command_line_route(
    tmp_path: Path, relay_tells_environment: None
) -> None:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text('developer_instructions = "mine"\n')
    async with codex_bridge(tmp_path, agent_env={"CODEX_HOME": str(home)}) as h:
        identity = await h.served_by(await h.new(append("ours")))
    assert identity["developer"] == "ours"
    assert h.overrides(identity["pid"]) == {"developer_instructions": '"ours"'}


# --- codex-acp 2.x: native append, override through CODEX_CONFIG -----------------------

APP_SERVER_RESULT: dict[str, Any] = {
    "protocolVersion": 1,
    "agentInfo": {"name": "@agentclientprotocol/codex-acp", "version": "2.6.0"},
    "agentCapabilities": {"sessionCapabilities": {"resume": {}, "systemPrompt": {}}},
}


def test_codex_acp_2_is_recognised_only_with_its_native_append() -> None:
    assert CodexAdapter.detect(APP_SERVER_RESULT)
    without = json.loads(json.dumps(APP_SERVER_RESULT))
    del without["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]
    # 2.0-2.2: no native append and no proven route of the bridge's own.
    assert not CodexAdapter.detect(without)
    assert CodexAdapter.delivery(CodexAdapter.__new__(CodexAdapter), without) is None
    delivery = CodexAdapter.delivery(CodexAdapter.__new__(CodexAdapter), APP_SERVER_RESULT)
    assert delivery is not None and delivery.append and delivery.override


def test_what_codex_acp_2_takes_natively_is_read_once_per_initialize_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every session/new asks it (twice: is the prompt native, then which process).
    read: list[Any] = []
    real = codex_module.native_delivery

    def counting(result: Any) -> Any:
        read.append(result)
        return real(result)

    monkeypatch.setattr(codex_module, "native_delivery", counting)
    context = ContextWithEnvironment({"CODEX_HOME": str(tmp_path)})
    context.primary = Primary()
    context.primary.initialize_result = APP_SERVER_RESULT
    adapter = CodexAdapter(context)
    appended = SystemPrompt.of_text("append", "native")
    overriding = SystemPrompt.of_text("override", "a process")
    for _ in range(5):
        assert adapter.process_prompt(appended) is None  # the primary takes it
        assert adapter.process_prompt(overriding) == overriding
    assert len(read) == 1
    context.primary.initialize_result = json.loads(json.dumps(APP_SERVER_RESULT))
    assert adapter.process_prompt(appended) is None and len(read) == 2
    context.primary.initialize_result = None  # 0.16, or no answer yet: nothing native
    assert adapter.process_prompt(appended) == appended


@pytest.mark.parametrize("value", [None, "", '{"model": "gpt-5.4", "hooks": {"a": [1]}}'])
def test_an_override_process_keeps_the_users_codex_config(value: str | None) -> None:
    config = user_codex_config(value)
    assert config == (json.loads(value) if value else {})


@pytest.mark.parametrize("value", ["not json", "[1]", '"text"'])
def test_a_codex_config_that_is_no_json_object_refuses_the_override(value: str) -> None:
    with pytest.raises(PromptRefused) as refused:
        user_codex_config(value)
    assert "CODEX_CONFIG" in str(refused.value)
