"""Text with no UTF-8 form (a lone surrogate, valid JSON) wherever the bridge encodes it
itself (spec §2): the session store, the ``sessions`` command's output.

The wire, the trace and system prompt validation are covered in ``test_wire_edges.py``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner
from conftest import BridgeLines, OpenBridge, OpenMemoryBridge

from acp_bridge.commands.sessions_cli import sessions
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.model_endpoint.records import RecordedRequest
from acp_bridge.model_endpoint.server import RequestLog
from acp_bridge.state.store import SessionStore
from acp_bridge.wire.jsonrpc import INVALID_PARAMS

LONE = "\ud800"
LONE_ESCAPED = b'"\\ud800"'
INITIALIZE = {"protocolVersion": 1, "clientCapabilities": {}}


async def load_the_session_named_lone(bridge: BridgeLines) -> None:
    """``initialize``, then ``session/load`` (id 1) of the session whose id is
    :data:`LONE`, sent as a client writes it: answered with an empty result."""
    await bridge.request(0, "initialize", INITIALIZE)
    await bridge.response_to(0)
    await bridge.send_line(
        b'{"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":'
        + LONE_ESCAPED
        + b',"cwd":"/","mcpServers":[]}}'
    )
    assert (await bridge.response_to(1)) == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_store_keeps_and_finds_ids_that_have_no_utf8_form() -> None:
    ids = [LONE, "a" + LONE, "a\udc00", "a", "\udced\udca0\udc80"]
    with SessionStore(":memory:") as store:
        for number, session_id in enumerate(ids):
            prompt = SystemPrompt.of_text("append", f"prompt {number}")
            store.save(LONE, session_id, prompt, parent_id="p" + LONE)
        store.save("agent", LONE, None)
        for number, session_id in enumerate(ids):
            record = store.get(LONE, session_id)
            assert record is not None and record.session_id == session_id
            assert record.agent == LONE and record.parent_id == "p" + LONE
            assert record.prompt is not None and record.prompt.text == f"prompt {number}"
        store.set_live(LONE, LONE, False)
        store.set_delivered(LONE, LONE, "abc")
        record = store.get(LONE, LONE)
        assert record is not None and (record.live, record.delivered) == (False, "abc")
        assert store.get("agent", LONE) is not None and store.get("agent", "a" + LONE) is None
        assert sorted(r.session_id for r in store.list(LONE)) == sorted(ids)
        assert store.forget(LONE, "a" + LONE)
        assert store.get(LONE, "a" + LONE) is None and store.get(LONE, "a") is not None
        assert store.forget_all(LONE) == len(ids) - 1
        assert [r.agent for r in store.list()] == ["agent"]


def test_store_reads_a_database_written_before_blobs(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    with SessionStore(path) as store:
        store.save("agent", "plain", SystemPrompt.of_text("append", "x"))
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT typeof(session_id) FROM sessions").fetchall() == [("text",)]
    with SessionStore(path) as store:
        store.save("agent", LONE, None)
        record = store.get("agent", "plain")
        assert record is not None and record.prompt == SystemPrompt.of_text("append", "x")
        assert {r.session_id for r in store.list("agent")} == {"plain", LONE}


async def test_session_load_of_an_id_with_a_lone_surrogate(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await load_the_session_named_lone(bridge)
            await bridge.request(
                2,
                "session/load",
                {"sessionId": LONE, "cwd": "/", "mcpServers": [], "systemPrompt": None},
            )
            assert "result" in await bridge.response_to(2)


async def test_agent_handing_out_ids_and_a_name_with_lone_surrogates(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    prompt = {"mode": "append", "content": [{"type": "text", "text": "be brief"}]}
    with trio.fail_after(30):
        async with open_memory_bridge(
            "--name", "agent" + LONE, "--session-prefix", LONE, "--caps", _caps()
        ) as bridge:
            await bridge.request(0, "initialize", INITIALIZE)
            await bridge.response_to(0)
            new = {"cwd": "/", "mcpServers": [], "systemPrompt": prompt}
            await bridge.request(1, "session/new", new)
            session_id = (await bridge.response_to(1))["result"]["sessionId"]
            assert session_id.startswith(LONE)
            loaded = {"sessionId": session_id, "cwd": "/", "mcpServers": []}
            await bridge.request(2, "session/load", loaded)
            assert "result" in await bridge.response_to(2)
            await bridge.request(3, "session/prompt", {"sessionId": session_id, "prompt": []})
            assert (await bridge.response_to(3))["result"] == {"stopReason": "end_turn"}


def _caps() -> str:
    return json.dumps({"loadSession": True, "sessionCapabilities": {"systemPrompt": {}}})


def test_sessions_command_prints_ids_with_lone_surrogates(tmp_path: Path) -> None:
    state = tmp_path / "sessions.sqlite3"
    with SessionStore(state) as store:
        store.save("agent" + LONE, "s" + LONE, SystemPrompt.of_text("append", "x"), live=False)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"}
    for args in (["list"], ["list", "--json"]):
        run = subprocess.run(
            [sys.executable, "-m", "acp_bridge", "sessions", "--state", str(state), *args],
            capture_output=True,
            env=env,
            check=False,
        )
        assert run.returncode == 0, (args, run.stderr)
        assert b"\\ud800" in run.stdout, (args, run.stdout)


def test_sessions_show_and_forget_an_id_with_a_lone_surrogate(tmp_path: Path) -> None:
    state = tmp_path / "sessions.sqlite3"
    with SessionStore(state) as store:
        store.save("agent" + LONE, "s" + LONE, SystemPrompt.of_text("append", "x"), live=False)
    base = ["--state", str(state)]
    shown = CliRunner().invoke(sessions, [*base, "show", "s" + LONE])
    assert shown.exit_code == 0, shown.output
    assert "s\\ud800" in shown.output and "agent\\ud800" in shown.output
    as_json = CliRunner().invoke(sessions, [*base, "show", "--json", "s" + LONE])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)["agent"] == "agent" + LONE
    forgot = CliRunner().invoke(sessions, [*base, "forget", "s" + LONE])
    assert forgot.exit_code == 0, forgot.output
    with SessionStore(state) as store:
        assert store.list() == []


def test_model_endpoint_logs_a_request_body_with_a_lone_surrogate(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    record = RecordedRequest(
        seq=1,
        method="POST",
        path="/v1/messages",
        query="",
        headers={},
        body={"system": "a" + LONE},
        timestamp=0.0,
        flavour="anthropic",
        kind="main",
    )
    RequestLog(log_path).add(record)
    (line,) = log_path.read_bytes().splitlines()
    assert RecordedRequest.from_json(json.loads(line)).body == {"system": "a" + LONE}


@pytest.mark.parametrize("method", ["session/new", "session/load", "session/resume"])
async def test_system_prompt_with_a_lone_surrogate_is_refused_before_any_adapter(
    open_memory_bridge: OpenMemoryBridge, method: str
) -> None:
    caps = json.dumps(
        {
            "loadSession": True,
            "sessionCapabilities": {"systemPrompt": {}, "resume": {}},
        }
    )
    with trio.fail_after(30):
        async with open_memory_bridge("--caps", caps) as bridge:
            await bridge.request(0, "initialize", INITIALIZE)
            await bridge.response_to(0)
            session = b"" if method == "session/new" else b'"sessionId":"s",'
            await bridge.send_line(
                b'{"jsonrpc":"2.0","id":1,"method":"'
                + method.encode()
                + b'","params":{'
                + session
                + b'"cwd":"/","mcpServers":[],"systemPrompt":{"mode":"append","content":'
                b'[{"type":"text","text":"a\\ud800"}]}}}'
            )
            error = (await bridge.response_to(1))["error"]
            assert error["code"] == INVALID_PARAMS
            assert error["data"]["field"] == "systemPrompt.content[0].text"


async def test_user_prompt_with_a_lone_surrogate_reaches_the_agent(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request(0, "initialize", INITIALIZE)
            await bridge.response_to(0)
            await bridge.request(1, "session/new", {"cwd": "/", "mcpServers": []})
            session_id = (await bridge.response_to(1))["result"]["sessionId"]
            await bridge.request(
                2,
                "session/prompt",
                {"sessionId": session_id, "prompt": [{"type": "text", "text": "a" + LONE}]},
            )
            assert (await bridge.response_to(2))["result"] == {"stopReason": "end_turn"}
            received = bridge.agents[0].received_raw
            assert any(b'"a\\ud800"' in line for line in received), received


async def test_bridge_process_logs_text_with_lone_surrogates(
    open_bridge: OpenBridge, tmp_path: Path
) -> None:
    state = tmp_path / "sessions.sqlite3"
    with trio.fail_after(60):
        async with open_bridge(config={"log_level": "debug", "state": str(state)}) as bridge:
            await load_the_session_named_lone(bridge)
        assert "Logging error" not in bridge.stderr() and "Traceback" not in bridge.stderr()
    with SessionStore(state) as store:
        assert [(r.agent, r.session_id) for r in store.list()] == [("fake-agent", LONE)]
