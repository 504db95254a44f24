"""The claude adapter's wire shapes per claude-agent-acp version, without an agent."""

from __future__ import annotations

import json
from typing import Any

import trio
from acp_bridge.adapters.claude import (
    SUCCESSOR_NAME,
    ClaudeAdapter,
    ClaudeAgent,
    merge_meta,
    parse_version,
    system_prompt_meta,
)
from conftest import OpenMemoryBridge

from acp_bridge.core.system_prompt import SystemPrompt


def initialize(name: str, version: str, **session: Any) -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "agentCapabilities": {"sessionCapabilities": session},
        "agentInfo": {"name": name, "version": version},
    }


LEGACY = ClaudeAgent.from_initialize(initialize("@zed-industries/claude-agent-acp", "0.23.1"))
PRE_SNAPSHOT = ClaudeAgent.from_initialize(
    initialize("@agentclientprotocol/claude-agent-acp", "0.72.0")
)
PINNING = ClaudeAgent.from_initialize(initialize("@agentclientprotocol/claude-agent-acp", "0.91.0"))


def test_detects_every_claude_agent_acp_package_name() -> None:
    for name in (
        "@zed-industries/claude-agent-acp",
        "@zed-industries/claude-code-acp",
        "@agentclientprotocol/claude-agent-acp",
    ):
        assert ClaudeAdapter.detect(initialize(name, "0.1.0"))
    assert not ClaudeAdapter.detect(initialize("codex-acp", "0.16.0"))


def test_only_successor_releases_with_the_snapshot_option_pin_prompts() -> None:
    assert not LEGACY.pins_prompts
    assert not PRE_SNAPSHOT.pins_prompts
    assert PINNING.pins_prompts
    assert parse_version("0.101.0-beta.1") == (0, 101, 0)
    assert parse_version(None) is None


def test_append_is_an_object_with_snapshot_off_where_prompts_are_pinned() -> None:
    prompt = SystemPrompt.of_text("append", "one", "two")
    assert system_prompt_meta(prompt, LEGACY) == {"systemPrompt": {"append": "one\n\ntwo"}}
    assert system_prompt_meta(prompt, PINNING) == {
        "systemPrompt": {"append": "one\n\ntwo", "snapshot": False}
    }


def test_override_is_a_string_plus_a_custom_sdk_prompt_where_prompts_are_pinned() -> None:
    prompt = SystemPrompt.of_text("override", "X")
    assert system_prompt_meta(prompt, LEGACY) == {"systemPrompt": "X"}
    assert system_prompt_meta(prompt, PINNING) == {
        "systemPrompt": "X",
        "claudeCode": {
            "options": {"systemPrompt": {"type": "custom", "prompt": "X", "snapshot": False}}
        },
    }


def test_no_prompt_leaves_meta_alone_unless_the_default_must_not_be_pinned() -> None:
    assert system_prompt_meta(None, LEGACY) is None
    assert system_prompt_meta(None, PINNING) == {"systemPrompt": {"snapshot": False}}


def test_merge_keeps_the_clients_meta_and_does_not_change_it() -> None:
    client = {"trace": 1, "claudeCode": {"options": {"model": "m"}}, "systemPrompt": "old"}
    merged = merge_meta(
        client, system_prompt_meta(SystemPrompt.of_text("override", "X"), PINNING) or {}
    )
    assert merged["trace"] == 1
    assert merged["systemPrompt"] == "X"
    assert merged["claudeCode"]["options"]["model"] == "m"
    assert merged["claudeCode"]["options"]["systemPrompt"]["prompt"] == "X"
    assert client == {"trace": 1, "claudeCode": {"options": {"model": "m"}}, "systemPrompt": "old"}


# ------------------------------------------------------------------------------------
# Running as root: the error claude-agent-acp 0.101.0 answers session/new with when it is
# root and IS_SANDBOX is set to anything but 1 (measured; tests/e2e/test_claude.py runs
# the real one).

ROOT_REFUSAL = (
    "Internal error: --dangerously-skip-permissions cannot be used with root/sudo privileges "
    "for security reasons"
)
INIT = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
NEW = b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}'


async def session_new_error(
    open_memory_bridge: OpenMemoryBridge, message: str
) -> tuple[dict[str, Any], bytes]:
    """session/new through the bridge in front of a fake claude-agent-acp whose session/new
    fails with ``message``; the error and the raw line the client got."""
    agent = ["--name", SUCCESSOR_NAME, "--fail-method", "session/new", "--fail-message", message]
    with trio.fail_after(30):
        async with open_memory_bridge(*agent) as bridge:
            await bridge.send_line(INIT)
            await bridge.send_line(NEW)
            await bridge.response_to(2)
            await bridge.close_stdin()
            await bridge.read_to_eof()
    lines = bytes(bridge.received).splitlines()
    (line,) = [raw for raw in lines if json.loads(raw).get("id") == 2]
    return json.loads(line)["error"], line


async def test_the_root_refusal_gets_a_hint_about_is_sandbox(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    error, _ = await session_new_error(open_memory_bridge, ROOT_REFUSAL)
    assert error["code"] == -32603
    message = error["message"]
    assert message.startswith(ROOT_REFUSAL)  # the agent's words first, as sent
    for words in ("IS_SANDBOX=1", "sandbox", "unset IS_SANDBOX", "agents:", "env:"):
        assert words in message, message


async def test_other_session_new_errors_pass_as_sent(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    _, line = await session_new_error(open_memory_bridge, "session/new failed on purpose")
    assert line == (
        b'{"jsonrpc": "2.0", "id": 2, "error": {"code": -32603, '
        b'"message": "session/new failed on purpose"}}'
    )


# ------------------------------------------------------------------------------------
# A changed prompt claude cannot take now: a live session of a build without session/close
# keeps the prompt it was opened with until the agent restarts (spec §6: logged).


def _prompt(text: str) -> dict[str, Any]:
    return {"mode": "append", "content": [{"type": "text", "text": text}]}


async def test_a_live_session_reloaded_with_another_prompt_logs_that_it_applies_later(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    caps = json.dumps({"loadSession": True, "sessionCapabilities": {}})  # no session/close
    lifecycle = {"cwd": "/", "mcpServers": []}
    with trio.fail_after(30):
        async with open_memory_bridge("--name", LEGACY.name, "--caps", caps) as bridge:
            await bridge.request(1, "initialize", {"protocolVersion": 1})
            await bridge.response_to(1)
            await bridge.request(
                2, "session/new", {**lifecycle, "systemPrompt": _prompt("Be brief.")}
            )
            session_id = (await bridge.response_to(2))["result"]["sessionId"]
            same = {**lifecycle, "sessionId": session_id, "systemPrompt": _prompt("Be brief.")}
            await bridge.request(3, "session/load", same)
            assert "result" in await bridge.response_to(3)
            assert "applies only after" not in bridge.stderr()  # the same prompt: nothing to say
            other = {**same, "systemPrompt": _prompt("Answer in French.")}
            await bridge.request(4, "session/load", other)
            assert "result" in await bridge.response_to(4)
            log = bridge.stderr()
    assert f"session {session_id} is live and its system prompt changed" in log
    assert "the new prompt applies only after the agent restarts" in log
    assert "Be brief" not in log and "French" not in log
