"""What the unstable schema (``@agentclientprotocol/sdk`` 2.4.0) says about ``systemPrompt``,
and the bridge following it (docs/adapters.md, "What the schema asks"):

* clients MUST NOT send an empty ``content`` array: ``-32602`` naming ``systemPrompt.content``;
* a mode the agent does not support is an error, never taken as append or override;
  modes starting with ``_`` belong to implementations and unknown modes "are preserved so
  they can be stored, proxied, or forwarded": a ``_`` mode goes through untouched to an
  agent that advertises it natively in its capability's ``mode`` map, and is refused
  otherwise;
* version 2 carries the prompt on ``session/new``, ``session/resume`` and ``session/fork``;
  it has no ``session/load``, so the bridge leaves that method alone on a v2 connection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest
import trio
from harness import TIMEOUT, FakeAgent, Restart, bridge_in_process, lifecycle_params, wire_prompt

from acp_bridge.state.store import SessionStore

INVALID_PARAMS: Final = -32602
TERSE: Final = "_example.org/terse"
# A native agent with a mode of its own besides override, with a value the bridge must keep.
CUSTOM_MODES: Final[dict[str, Any]] = {
    "sessionCapabilities": {
        "systemPrompt": {"mode": {"override": {}, TERSE: {"_meta": {"level": 2}}}},
        "resume": {},
    },
    "loadSession": True,
}


def terse_prompt(text: str) -> dict[str, Any]:
    # Unknown keys on the prompt and its block: "untouched" means those too.
    return {
        "mode": TERSE,
        "content": [{"type": "text", "text": text, "future": 1}],
        "_meta": {"k": "v"},
        "later": [1],
    }


async def test_empty_content_is_refused_naming_the_field_on_every_lifecycle_method(
    tmp_path: Path,
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=CUSTOM_MODES)
    empty = {"mode": "append", "content": []}
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            await peer.initialize()
            session_id = await peer.new()
            for method in ("session/new", "session/load", "session/resume"):
                error = await peer.error(method, lifecycle_params(method, session_id, empty))
                assert error["code"] == INVALID_PARAMS
                assert error["data"] == {"field": "systemPrompt.content"}
            await peer.sync()
    # Even to an agent that takes the field itself, an empty array is not forwarded.
    assert agent.params_of("session/new") == [{"cwd": "/", "mcpServers": []}]
    assert agent.params_of("session/load") == agent.params_of("session/resume") == []


async def test_custom_mode_the_agent_advertises_is_advertised_and_goes_through_untouched(
    tmp_path: Path,
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=CUSTOM_MODES)
    prompt = terse_prompt("Answer in one line.")
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            result = await peer.initialize()
            session_id = await peer.new(prompt)
            await peer.resume(session_id, prompt)
            await peer.sync()
    advertised = result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]
    assert advertised == {"mode": {"override": {}, TERSE: {"_meta": {"level": 2}}}}
    assert agent.params_of("session/new")[0]["systemPrompt"] == prompt
    assert agent.params_of("session/resume")[0]["systemPrompt"] == prompt


async def test_custom_mode_survives_a_bridge_restart_in_the_store(tmp_path: Path) -> None:
    # "Preserved so they can be stored": an omitted prompt on load is the stored one.
    restart = Restart(tmp_path, caps=CUSTOM_MODES)
    prompt = terse_prompt("Answer in one line.")
    with trio.fail_after(TIMEOUT):
        async with restart.before() as peer:
            session_id = await peer.new(prompt)
        async with restart.after() as peer:
            await peer.load(session_id)
            await peer.sync()
    assert restart.second.params_of("session/load")[0]["systemPrompt"] == prompt


@pytest.mark.parametrize(
    ("caps", "mode"),
    [
        # Advertised by nobody: the agent has other modes, not this one.
        (CUSTOM_MODES, "_example.org/other"),
        # A native agent without a mode map.
        ({"sessionCapabilities": {"systemPrompt": {}}}, TERSE),
        # An agent without the capability (the first-turn route): nothing is native.
        ({}, TERSE),
        # Not an implementation's mode: a future ACP variant the bridge does not know.
        (CUSTOM_MODES, "replace"),
    ],
)
async def test_a_mode_the_agent_does_not_advertise_is_refused(
    tmp_path: Path, caps: dict[str, Any], mode: str
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=caps)
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            await peer.initialize()
            error = await peer.error(
                "session/new",
                lifecycle_params("session/new", None, terse_prompt("x") | {"mode": mode}),
            )
            await peer.sync()
    assert error["code"] == INVALID_PARAMS
    assert error["data"] == {"field": "systemPrompt.mode"}
    assert agent.params_of("session/new") == []


async def test_a_custom_mode_is_not_advertised_by_an_adapter_that_does_not_pass_it_on(
    tmp_path: Path,
) -> None:
    # first-turn delivers append itself; the agent's own modes are not its to promise.
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=CUSTOM_MODES)
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, adapter="first-turn") as peer:
            result = await peer.initialize()
            error = await peer.error(
                "session/new", lifecycle_params("session/new", None, terse_prompt("x"))
            )
    assert result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}
    assert error["data"] == {"field": "systemPrompt.mode"}


async def test_v2_session_load_is_not_a_lifecycle_method_and_passes_as_sent(
    tmp_path: Path,
) -> None:
    # v2 has no session/load: the bridge neither validates, strips nor fills a prompt there.
    agent = FakeAgent(tmp_path / "agent.jsonl", caps={"session": {"resume": {}}})
    invalid = {"mode": "append", "content": []}
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, version=2) as peer:
            await peer.initialize()
            session_id = await peer.new(wire_prompt("Be brief."))
            frame = await peer.client.request_raw(
                "session/load", lifecycle_params("session/load", session_id, invalid)
            )
            await peer.client.request_raw(
                "session/load", lifecycle_params("session/load", session_id)
            )
            resumed = await peer.error(
                "session/resume", lifecycle_params("session/resume", session_id, invalid)
            )
            await peer.sync()
    assert "error" not in frame
    loads = agent.params_of("session/load")
    assert loads[0]["systemPrompt"] == invalid
    assert "systemPrompt" not in loads[1]
    # new, resume and fork still carry it on v2.
    assert resumed["data"] == {"field": "systemPrompt.content"}


async def test_a_stored_prompt_this_bridge_cannot_deliver_is_not_filled_in(
    tmp_path: Path,
) -> None:
    # Stored with override advertised; reopened where policy forbids override: the agent
    # gets its default rather than a mode the client was never offered.
    first = FakeAgent(tmp_path / "first.jsonl", caps=CUSTOM_MODES)
    second = FakeAgent(tmp_path / "second.jsonl", caps=CUSTOM_MODES)
    with trio.fail_after(TIMEOUT), SessionStore(str(tmp_path / "state.db")) as store:
        async with bridge_in_process(first, store) as peer:
            await peer.initialize()
            session_id = await peer.new(wire_prompt("Only this.", mode="override"))
        async with bridge_in_process(second, store, allow_override=False) as peer:
            await peer.initialize()
            await peer.load(session_id)
            await peer.sync()
    assert first.params_of("session/new")[0]["systemPrompt"]["mode"] == "override"
    assert "systemPrompt" not in second.params_of("session/load")[0]
