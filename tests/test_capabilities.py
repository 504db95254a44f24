"""What the client sees in the ``initialize`` response (spec §4), for ACP v1 and v2.

The bridge adds ``systemPrompt`` (with ``mode.override`` only when the adapter can deliver it
and policy allows) and its ``_meta["acp-bridge"]`` entry; every other key is the agent's.
Each initialize response is validated against the official schema by :class:`harness.Peer`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Final

import pytest
import trio
from harness import (
    NATIVE_APPEND,
    NATIVE_OVERRIDE,
    TIMEOUT,
    FakeAgent,
    bridge_in_process,
    wire_prompt,
)
from schema import validate_definition

from acp_bridge import __version__
from acp_bridge.adapter import Delivery
from acp_bridge.core.capabilities import advertise
from acp_bridge.state.store import SessionStore

# Everything an agent may say about itself; the bridge must keep all of it.
RICH_CAPS: Final[dict[str, Any]] = {
    "loadSession": True,
    "promptCapabilities": {"image": True, "audio": False, "embeddedContext": True},
    "mcpCapabilities": {"http": True, "sse": False},
    "sessionCapabilities": {"list": {}, "resume": {}, "fork": {}, "close": {}},
    "_meta": {"vendor.example/feature": {"level": 3}},
    "vendorExtension": [1, 2, 3],
}


def agent_result(caps: dict[str, Any], *, version: int = 1) -> dict[str, Any]:
    """The initialize result the fake agent sends (see tests/fake_agent.py)."""
    if version == 2:
        return {
            "protocolVersion": 2,
            "info": {"name": "fake-agent", "version": "1.0.0"},
            "capabilities": caps,
            "authMethods": [],
        }
    return {
        "protocolVersion": 1,
        "agentCapabilities": caps,
        "agentInfo": {"name": "fake-agent", "version": "1.0.0"},
        "authMethods": [],
    }


def bridge_meta(adapter: str) -> dict[str, Any]:
    return {"version": __version__, "adapter": adapter}


async def initialize(
    tmp_path: Path, caps: dict[str, Any], *, version: int = 1, **options: Any
) -> dict[str, Any]:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=caps)
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, version=version, **options) as peer:
            return await peer.initialize()


async def test_append_only_adapter_advertises_empty_object_and_keeps_every_other_key(
    tmp_path: Path,
) -> None:
    result = await initialize(tmp_path, RICH_CAPS)
    expected = agent_result(copy.deepcopy(RICH_CAPS))
    caps = expected["agentCapabilities"]
    caps["sessionCapabilities"]["systemPrompt"] = {}
    caps["_meta"]["acp-bridge"] = bridge_meta("first-turn")
    assert result == expected


async def test_capability_is_created_when_agent_has_no_session_capabilities(
    tmp_path: Path,
) -> None:
    result = await initialize(tmp_path, {})
    assert result["agentCapabilities"] == {
        "sessionCapabilities": {"systemPrompt": {}},
        "_meta": {"acp-bridge": bridge_meta("first-turn")},
    }


async def test_first_turn_never_offers_override_even_when_policy_allows(tmp_path: Path) -> None:
    result = await initialize(tmp_path, {}, allow_override=True)
    assert result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}


async def test_native_mirrors_override_the_agent_advertises(tmp_path: Path) -> None:
    result = await initialize(tmp_path, NATIVE_OVERRIDE)
    caps = result["agentCapabilities"]
    assert caps["sessionCapabilities"]["systemPrompt"] == {"mode": {"override": {}}}
    assert caps["_meta"]["acp-bridge"] == bridge_meta("native")


async def test_native_mirrors_append_only(tmp_path: Path) -> None:
    result = await initialize(tmp_path, NATIVE_APPEND)
    assert result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}


async def test_no_override_policy_narrows_native_override_to_append(tmp_path: Path) -> None:
    result = await initialize(tmp_path, NATIVE_OVERRIDE, allow_override=False)
    assert result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}


async def test_adapter_option_overrides_automatic_choice(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=NATIVE_OVERRIDE)
    prompt = wire_prompt("Be brief.")
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, adapter="first-turn") as peer:
            result = await peer.initialize()
            session_id = await peer.new(prompt)
            await peer.prompt(session_id)
    caps = result["agentCapabilities"]
    # The agent could override, but the chosen adapter cannot: do not promise it.
    assert caps["sessionCapabilities"]["systemPrompt"] == {}
    assert caps["_meta"]["acp-bridge"] == bridge_meta("first-turn")
    # Delivered the first-turn way, not passed through.
    assert "systemPrompt" not in agent.params_of("session/new")[0]
    assert agent.prompts(session_id)[0][0] == {"type": "text", "text": "Be brief."}


async def test_native_chosen_on_an_agent_without_the_capability_advertises_nothing(
    tmp_path: Path,
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps={"loadSession": True})
    prompt = wire_prompt("Be brief.")
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, adapter="native") as peer:
            result = await peer.initialize()
            await peer.new(prompt)
            await peer.sync()
    assert result == agent_result({"loadSession": True})


async def test_passthrough_forwards_initialize_byte_for_byte_and_intercepts_nothing(
    tmp_path: Path,
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=RICH_CAPS)
    invalid = {"mode": "_custom", "content": []}
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, adapter="passthrough") as peer:
            result = await peer.initialize()
            await peer.new(invalid)
            assert peer.tee is not None
            received = peer.tee.lines()
        assert store.list() == []
    # The fake agent writes json.dumps(...) with its spaces; the bridge never re-encodes so.
    sent = {"jsonrpc": "2.0", "id": 1, "result": agent_result(RICH_CAPS)}
    assert received[0] == json.dumps(sent).encode()
    assert result == agent_result(RICH_CAPS)
    # Nothing validated, nothing removed: the agent got the field as the client sent it.
    assert agent.params_of("session/new")[0]["systemPrompt"] == invalid


async def test_v2_puts_capability_under_capabilities_session(tmp_path: Path) -> None:
    caps = {"session": {"delete": {}}, "_meta": {"vendor.example/x": True}}
    result = await initialize(tmp_path, caps, version=2)
    assert result == {
        "protocolVersion": 2,
        "info": {"name": "fake-agent", "version": "1.0.0"},
        "capabilities": {
            "session": {"delete": {}, "systemPrompt": {}},
            "_meta": {"vendor.example/x": True, "acp-bridge": bridge_meta("first-turn")},
        },
        "authMethods": [],
    }


async def test_v2_native_override_is_mirrored(tmp_path: Path) -> None:
    caps: dict[str, Any] = {"session": {"systemPrompt": {"mode": {"override": {}}}}}
    result = await initialize(tmp_path, caps, version=2)
    assert result["capabilities"]["session"]["systemPrompt"] == {"mode": {"override": {}}}
    assert result["capabilities"]["_meta"]["acp-bridge"] == bridge_meta("native")


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("override", [False, True])
def test_advertised_result_is_valid_initialize_response(version: int, override: bool) -> None:
    caps: dict[str, Any] = {"session": {}} if version == 2 else {}
    result = advertise(
        agent_result(caps, version=version), Delivery(override=override), adapter="x"
    )
    validate_definition(result, "InitializeResponse", version=version)
    session_key = (
        ("capabilities", "session")
        if version == 2
        else ("agentCapabilities", "sessionCapabilities")
    )
    advertised = result[session_key[0]][session_key[1]]["systemPrompt"]
    validate_definition(advertised, "SessionSystemPromptCapabilities", version=version)
    assert advertised == ({"mode": {"override": {}}} if override else {})


def test_advertise_does_not_change_the_agents_result() -> None:
    original = agent_result(copy.deepcopy(RICH_CAPS))
    before = copy.deepcopy(original)
    advertise(original, Delivery(override=True), adapter="x")
    assert original == before


def test_advertise_without_delivery_withdraws_the_agents_own_capability() -> None:
    result = advertise(agent_result(copy.deepcopy(NATIVE_OVERRIDE)), None, adapter="x")
    assert result["agentCapabilities"]["sessionCapabilities"] == {}


def test_schema_check_catches_a_capability_the_schema_does_not_allow() -> None:
    # The helper must not be vacuous: a wrong shape under systemPrompt is an error.
    result = agent_result({"sessionCapabilities": {"systemPrompt": {"mode": "override"}}})
    with pytest.raises(AssertionError, match="InitializeResponse"):
        validate_definition(result, "InitializeResponse", version=1)
    with pytest.raises(AssertionError, match="Error"):
        validate_definition({"code": "-32602", "message": "x"}, "Error", version=2)
