"""``take_system_prompt``: the standard field, or the RFD shape in ``_meta.systemPrompt``
sent by SDK clients whose schema predates the field; claude's own forms are left alone."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest
from conftest import OpenMemoryBridge

from acp_bridge.core.system_prompt import PromptRejected, parse_system_prompt, take_system_prompt

RFD = {"mode": "append", "content": [{"type": "text", "text": "Be brief."}]}


def test_the_standard_field_is_taken_and_removed() -> None:
    params: dict[str, Any] = {"sessionId": "s", "systemPrompt": RFD, "_meta": {"x": 1}}
    assert take_system_prompt(params) == (RFD, "systemPrompt")
    assert params == {"sessionId": "s", "_meta": {"x": 1}}


def test_no_prompt_anywhere_leaves_params_alone() -> None:
    params: dict[str, Any] = {"cwd": "/", "_meta": {"x": 1}}
    assert take_system_prompt(params) == (None, "systemPrompt")
    assert params == {"cwd": "/", "_meta": {"x": 1}}


def test_rfd_shape_in_meta_is_the_prompt_when_the_field_is_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    params: dict[str, Any] = {"cwd": "/", "_meta": {"systemPrompt": RFD, "trace": "t1"}}
    with caplog.at_level(logging.DEBUG, logger="acp_bridge"):
        raw, source = take_system_prompt(params)
    assert (raw, source) == (RFD, "_meta.systemPrompt")
    # Only the prompt leaves _meta; the client's other keys are forwarded as sent.
    assert params == {"cwd": "/", "_meta": {"trace": "t1"}}
    assert any(
        r.levelno == logging.DEBUG and "_meta.systemPrompt" in r.message for r in caplog.records
    )
    assert "Be brief." not in caplog.text
    assert parse_system_prompt(raw, override_allowed=False) is not None


def test_a_meta_that_held_only_the_prompt_is_dropped() -> None:
    params: dict[str, Any] = {"cwd": "/", "_meta": {"systemPrompt": RFD}}
    assert take_system_prompt(params)[1] == "_meta.systemPrompt"
    assert params == {"cwd": "/"}


def test_a_null_standard_field_counts_as_absent() -> None:
    params: dict[str, Any] = {"systemPrompt": None, "_meta": {"systemPrompt": RFD}}
    assert take_system_prompt(params) == (RFD, "_meta.systemPrompt")
    assert params == {}


def test_the_standard_field_wins_and_meta_stays_as_sent() -> None:
    other = {"mode": "override", "content": [{"type": "text", "text": "other"}]}
    params: dict[str, Any] = {"systemPrompt": RFD, "_meta": {"systemPrompt": other}}
    assert take_system_prompt(params) == (RFD, "systemPrompt")
    assert params == {"_meta": {"systemPrompt": other}}


@pytest.mark.parametrize(
    "meta_prompt",
    [
        "You are a pirate.",  # claude-agent-acp: a string replaces the preset
        {"append": "Be brief."},  # claude-agent-acp: appended to the preset
        {"append": "x", "snapshot": False},
        {"mode": "append"},  # not the RFD shape: no content
        {"content": [{"type": "text", "text": "x"}]},  # nor this: no mode
        ["mode", "content"],
        None,
    ],
)
def test_other_meta_system_prompt_shapes_pass_through_untouched(meta_prompt: Any) -> None:
    params: dict[str, Any] = {"cwd": "/", "_meta": {"systemPrompt": meta_prompt, "k": [1]}}
    before = copy.deepcopy(params)
    assert take_system_prompt(params) == (None, "systemPrompt")
    assert params == before
    assert json.dumps(params) == json.dumps(before)  # key order too: nothing re-built


def test_a_bad_rfd_shaped_meta_prompt_is_rejected_like_the_standard_field() -> None:
    params: dict[str, Any] = {"_meta": {"systemPrompt": {"mode": "shout", "content": []}}}
    raw, source = take_system_prompt(params)
    assert source == "_meta.systemPrompt"
    with pytest.raises(PromptRejected) as rejected:
        parse_system_prompt(raw, override_allowed=True)
    assert rejected.value.field == "systemPrompt.mode"


def test_the_python_sdks_spelling_is_the_prompt_too() -> None:
    # agent-client-protocol 0.12.1: new_session(..., system_prompt={...}) puts the keyword
    # into _meta under the name given.
    params: dict[str, Any] = {"cwd": "/", "_meta": {"system_prompt": RFD, "trace": "t1"}}
    assert take_system_prompt(params) == (RFD, "_meta.system_prompt")
    assert params == {"cwd": "/", "_meta": {"trace": "t1"}}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("Be brief.", "_meta.system_prompt"),
        ({"mode": "append"}, "_meta.system_prompt.content"),
        ({"mode": "append", "content": [{"type": "image"}]}, "_meta.system_prompt.content[0].type"),
    ],
    ids=["string", "no-content", "image-block"],
)
def test_any_other_value_in_the_python_spelling_is_refused_naming_it(
    value: Any, field: str
) -> None:
    # No agent reads _meta.system_prompt: whatever is there was meant as the prompt, and
    # passing it on would lose it silently.
    params: dict[str, Any] = {"cwd": "/", "_meta": {"system_prompt": value}}
    raw, source = take_system_prompt(params)
    assert source == "_meta.system_prompt" and params == {"cwd": "/"}
    with pytest.raises(PromptRejected) as rejected:
        parse_system_prompt(raw, override_allowed=True)
    assert source + rejected.value.field.removeprefix("systemPrompt") == field


def test_a_null_python_spelling_is_left_alone() -> None:
    params: dict[str, Any] = {"cwd": "/", "_meta": {"system_prompt": None}}
    assert take_system_prompt(params) == (None, "systemPrompt")
    assert params == {"cwd": "/", "_meta": {"system_prompt": None}}


def test_the_standard_field_and_the_typescript_spelling_come_first() -> None:
    other = {"mode": "append", "content": [{"type": "text", "text": "other"}]}
    params: dict[str, Any] = {"_meta": {"systemPrompt": RFD, "system_prompt": other}}
    assert take_system_prompt(params) == (RFD, "_meta.systemPrompt")
    assert params == {"_meta": {"system_prompt": other}}


# ------------------------------------------------------------------------------------
# Through the bridge: a fake agent that names itself claude-agent-acp 0.101.0 (so the
# claude adapter is chosen) and advertises systemPrompt, as that release does.

CLAUDE_NATIVE_CAPS = json.dumps(
    {"loadSession": True, "sessionCapabilities": {"systemPrompt": {"mode": {"override": {}}}}}
)


@pytest.mark.parametrize(
    "meta_prompt",
    ['"You are a pirate. Say arr."', '{"append":"Say arr.","excludeDynamicSections":true}'],
    ids=["string", "append-object"],
)
async def test_claudes_own_meta_system_prompt_is_forwarded_byte_for_byte(
    open_memory_bridge: OpenMemoryBridge, meta_prompt: str
) -> None:
    agent_args = ("--name", "@agentclientprotocol/claude-agent-acp", "--caps", CLAUDE_NATIVE_CAPS)
    async with open_memory_bridge(*agent_args) as bridge:
        await bridge.request(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        initialized = await bridge.response_to(1)
        assert initialized["result"]["agentCapabilities"]["_meta"]["acp-bridge"]["adapter"] == (
            "claude"
        )
        # Odd spacing and key order on purpose: any re-serialisation would show.
        line = (
            b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"mcpServers":[],'
            b'"cwd":"/tmp",  "_meta":{"x-client":1,"systemPrompt":' + meta_prompt.encode() + b"}}}"
        )
        await bridge.send_line(line)
        response = await bridge.response_to(2)
        assert "result" in response, response
        received = (bridge.dir / "agent-received").read_bytes().splitlines()
    assert line in received
