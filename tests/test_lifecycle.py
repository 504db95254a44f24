"""Session lifecycle through the bridge (spec §6): what the agent receives, what the store holds.

new → prompt → load (omitted, same, different) → fork → close → delete, under both
``on_omitted`` policies, for the first-turn adapter (the prompt arrives in
``session/prompt``) and the native one (the ``systemPrompt`` field on each lifecycle
request); then across a restart of the bridge (a new one on the same state file) and with
two bridge processes writing one state file at once. All but the last run in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from harness import (
    AGENT_NAME,
    NATIVE_OVERRIDE,
    TIMEOUT,
    FakeAgent,
    Peer,
    Restart,
    bridge_in_process,
    bridge_process,
    fingerprint,
    wire_prompt,
)

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.state.store import SessionRecord, SessionStore

P1 = ("You are terse.", "Answer in French.")
P2 = ("You are verbose.",)


def text_block(*texts: str) -> dict[str, str]:
    return {"type": "text", "text": "\n\n".join(texts)}


def stored(store: SessionStore, session_id: str) -> SessionRecord:
    record = store.get(AGENT_NAME, session_id)
    assert record is not None, f"{session_id} is not stored"
    return record


def as_prompt(*texts: str) -> SystemPrompt:
    return SystemPrompt.of_text("append", *texts)


def user_block(text: str = "hello") -> dict[str, str]:
    return {"type": "text", "text": text}


# --- first-turn --------------------------------------------------------------------------


async def test_first_turn_lifecycle_with_keep(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT), SessionStore(tmp_path / "state.db") as store:
        async with bridge_in_process(agent, store, on_omitted="keep") as peer:
            await peer.initialize()
            sid = await peer.new(wire_prompt(*P1))
            assert "systemPrompt" not in agent.params_of("session/new")[0]
            assert stored(store, sid).prompt == as_prompt(*P1)
            assert stored(store, sid).delivered is None

            await peer.prompt(sid, "one")
            assert stored(store, sid).delivered == fingerprint(*P1)

            await peer.load(sid)  # omitted: keep the stored prompt, already delivered
            assert stored(store, sid).prompt == as_prompt(*P1)
            await peer.prompt(sid, "two")

            await peer.load(sid, wire_prompt(*P1))  # same prompt: nothing new to deliver
            await peer.prompt(sid, "three")

            await peer.load(sid, wire_prompt(*P2))  # different: applied on the next turn
            assert stored(store, sid).prompt == as_prompt(*P2)
            await peer.prompt(sid, "four")
            assert stored(store, sid).delivered == fingerprint(*P2)

            fork = await peer.fork(sid)  # inherits P2, which its history already holds
            assert stored(store, fork).prompt == as_prompt(*P2)
            assert stored(store, fork).parent_id == sid
            await peer.prompt(fork, "five")

            await peer.ok("session/close", {"sessionId": sid})
            assert stored(store, sid).live is False
            await peer.ok("session/delete", {"sessionId": sid})
            assert store.get(AGENT_NAME, sid) is None
            assert stored(store, fork).live is True

            await peer.sync()
    for params in agent.received():
        assert "systemPrompt" not in (params.get("params") or {})
    assert agent.prompts(sid) == [
        [text_block(*P1), user_block("one")],
        [user_block("two")],
        [user_block("three")],
        [text_block(*P2), user_block("four")],
    ]
    assert agent.prompts(fork) == [[user_block("five")]]


async def test_first_turn_lifecycle_with_default(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT), SessionStore(tmp_path / "state.db") as store:
        async with bridge_in_process(agent, store, on_omitted="default") as peer:
            await peer.initialize()
            sid = await peer.new(wire_prompt(*P1))
            await peer.prompt(sid, "one")

            await peer.load(sid)  # omitted: the agent's default from now on
            assert stored(store, sid).prompt is None
            await peer.prompt(sid, "two")

            await peer.load(sid, wire_prompt(*P2))
            assert stored(store, sid).prompt == as_prompt(*P2)
            await peer.prompt(sid, "three")

            fork = await peer.fork(sid)  # omitted: no inheritance under default
            assert stored(store, fork).prompt is None
            await peer.prompt(fork, "four")

            fork2 = await peer.fork(sid, wire_prompt(*P1))
            assert stored(store, fork2).prompt == as_prompt(*P1)
            await peer.prompt(fork2, "five")

            await peer.ok("session/close", {"sessionId": sid})
            assert stored(store, sid).live is False
            await peer.ok("session/delete", {"sessionId": sid})
            assert store.get(AGENT_NAME, sid) is None
    assert agent.prompts(sid) == [
        [text_block(*P1), user_block("one")],
        [user_block("two")],
        [text_block(*P2), user_block("three")],
    ]
    assert agent.prompts(fork) == [[user_block("four")]]
    assert agent.prompts(fork2) == [[text_block(*P1), user_block("five")]]


async def test_resume_with_different_prompt_is_applied(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            await peer.initialize()
            sid = await peer.new(wire_prompt(*P1))
            await peer.prompt(sid, "one")
            await peer.resume(sid, wire_prompt(*P2))
            await peer.prompt(sid, "two")
            await peer.resume(sid)
            await peer.prompt(sid, "three")
            assert stored(store, sid).prompt == as_prompt(*P2)
    assert agent.prompts(sid) == [
        [text_block(*P1), user_block("one")],
        [text_block(*P2), user_block("two")],
        [user_block("three")],
    ]


@pytest.mark.parametrize("method", ["session/load", "session/resume", "session/fork"])
async def test_failed_request_leaves_the_store_unchanged(tmp_path: Path, method: str) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", fail_methods=[method])
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            await peer.initialize()
            sid = await peer.new(wire_prompt(*P1))
            params: dict[str, Any] = {"sessionId": sid, "cwd": "/"}
            if method == "session/load":
                params["mcpServers"] = []
            params["systemPrompt"] = wire_prompt(*P2)
            error = await peer.error(method, params)
            assert error["code"] == -32603
            assert [r.session_id for r in store.list()] == [sid]
            assert stored(store, sid).prompt == as_prompt(*P1)


# --- native ------------------------------------------------------------------------------


async def test_native_lifecycle_with_keep_fills_omitted_prompt_from_store(
    tmp_path: Path,
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=NATIVE_OVERRIDE)
    p1 = wire_prompt(*P1)
    p2 = wire_prompt(*P2, mode="override")
    with trio.fail_after(TIMEOUT), SessionStore(tmp_path / "state.db") as store:
        async with bridge_in_process(agent, store, on_omitted="keep") as peer:
            await peer.initialize()
            sid = await peer.new(p1)
            await peer.prompt(sid)
            await peer.load(sid)
            await peer.resume(sid)
            await peer.load(sid, p1)
            fork = await peer.fork(sid)
            await peer.load(sid, p2)
            await peer.resume(sid)
            assert stored(store, fork).prompt == as_prompt(*P1)
            assert stored(store, sid).prompt == SystemPrompt.of_text("override", *P2)
            await peer.ok("session/close", {"sessionId": sid})
            assert stored(store, sid).live is False
            await peer.ok("session/delete", {"sessionId": sid})
            assert store.get(AGENT_NAME, sid) is None
    got = [(m["method"], m["params"].get("systemPrompt")) for m in agent.received()[1:]]
    assert got == [
        ("session/new", p1),
        ("session/prompt", None),
        ("session/load", p1),
        ("session/resume", p1),
        ("session/load", p1),
        ("session/fork", p1),
        ("session/load", p2),
        ("session/resume", p2),
        ("session/close", None),
        ("session/delete", None),
    ]
    # The prompt is the system prompt's business here, never a user turn.
    assert agent.prompts(sid) == [[user_block()]]


async def test_native_lifecycle_with_default_forwards_omitted_as_omitted(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=NATIVE_OVERRIDE)
    p1 = wire_prompt(*P1)
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, on_omitted="default") as peer:
            await peer.initialize()
            sid = await peer.new(p1)
            await peer.load(sid)
            assert stored(store, sid).prompt is None
            fork = await peer.fork(sid)
            assert stored(store, fork).prompt is None
            await peer.resume(sid, p1)
            assert stored(store, sid).prompt == as_prompt(*P1)
            await peer.sync()
    got = [(m["method"], m["params"].get("systemPrompt")) for m in agent.received()[1:-1]]
    assert got == [
        ("session/new", p1),
        ("session/load", None),
        ("session/fork", None),
        ("session/resume", p1),
    ]


# --- restart and sharing ------------------------------------------------------------------


async def test_native_load_after_bridge_restart_uses_the_stored_prompt(tmp_path: Path) -> None:
    restart = Restart(tmp_path, caps=NATIVE_OVERRIDE)
    p1 = wire_prompt(*P1)
    with trio.fail_after(TIMEOUT):
        async with restart.before() as peer:
            sid = await peer.new(p1)
        async with restart.after() as peer:
            await peer.load(sid)
            fork = await peer.fork(sid)
            await peer.sync()
    assert restart.second.params_of("session/load") == [
        {"sessionId": sid, "cwd": "/", "mcpServers": [], "systemPrompt": p1}
    ]
    assert restart.second.params_of("session/fork")[0]["systemPrompt"] == p1
    with SessionStore(restart.state) as store:
        assert stored(store, fork).prompt == as_prompt(*P1)
        assert stored(store, fork).parent_id == sid


async def test_first_turn_load_after_bridge_restart_uses_the_stored_prompt(
    tmp_path: Path,
) -> None:
    restart = Restart(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with restart.before() as peer:
            sid = await peer.new(wire_prompt(*P1))
            other = await peer.new(wire_prompt(*P2))  # never prompted before the restart
        async with restart.after() as peer:
            await peer.load(sid)
            await peer.prompt(sid)
            await peer.load(other)
            await peer.prompt(other)
    assert restart.second.prompts(sid) == [[text_block(*P1), user_block()]]
    assert restart.second.prompts(other) == [[text_block(*P2), user_block()]]


SESSIONS_PER_BRIDGE = 30


async def open_many(peer: Peer, label: str, ids: list[str]) -> None:
    async def one(index: int) -> None:
        ids.append(await peer.new(wire_prompt(f"{label} {index}")))

    await peer.initialize()
    async with trio.open_nursery() as nursery:
        for index in range(SESSIONS_PER_BRIDGE):
            nursery.start_soon(one, index)
    async with trio.open_nursery() as nursery:
        for session_id in list(ids):
            nursery.start_soon(peer.prompt, session_id)


async def test_two_bridges_in_memory_share_one_state_file_at_once(tmp_path: Path) -> None:
    # The in-memory counterpart of the test below: two bridges, each with its own connection
    # to one state file, write at once, and each reads what the other wrote while both run.
    state = tmp_path / "state.db"
    agents = {
        label: FakeAgent(tmp_path / f"{label}.jsonl", session_prefix=f"{label}-")
        for label in ("a", "b")
    }
    ids: dict[str, list[str]] = {label: [] for label in agents}
    with (
        trio.fail_after(TIMEOUT * 2),
        SessionStore(state) as store_a,
        SessionStore(state) as store_b,
    ):
        async with (
            bridge_in_process(agents["a"], store_a) as peer_a,
            bridge_in_process(agents["b"], store_b) as peer_b,
        ):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(open_many, peer_a, "a", ids["a"])
                nursery.start_soon(open_many, peer_b, "b", ids["b"])
            # A session the other bridge opened and still runs: loaded without a prompt
            # under keep, it runs with the one that bridge stored (else it would be none).
            crossed = ids["a"][0]
            written_by_a = stored(store_a, crossed).prompt
            await peer_b.load(crossed)
            assert written_by_a is not None and stored(store_b, crossed).prompt == written_by_a
        records = {r.session_id: r for r in store_a.list(AGENT_NAME)}
    assert len(records) == 2 * SESSIONS_PER_BRIDGE
    for label, session_ids in ids.items():
        texts = set()
        for session_id in session_ids:
            prompt = records[session_id].prompt
            assert prompt is not None and records[session_id].delivered == prompt.fingerprint()
            texts.add(prompt.text)
        assert texts == {f"{label} {index}" for index in range(SESSIONS_PER_BRIDGE)}


async def test_two_bridges_writing_one_state_file_lose_nothing(tmp_path: Path) -> None:
    state = str(tmp_path / "state.db")
    agents = {
        label: FakeAgent(tmp_path / f"{label}.jsonl", session_prefix=f"{label}-")
        for label in ("a", "b")
    }
    ids: dict[str, list[str]] = {label: [] for label in agents}
    with trio.fail_after(TIMEOUT * 2):
        async with (
            bridge_process(agents["a"], "--state", state, home=tmp_path) as peer_a,
            bridge_process(agents["b"], "--state", state, home=tmp_path) as peer_b,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(open_many, peer_a, "a", ids["a"])
            nursery.start_soon(open_many, peer_b, "b", ids["b"])
    with SessionStore(state) as store:
        records = {r.session_id: r for r in store.list(AGENT_NAME)}
    assert len(records) == 2 * SESSIONS_PER_BRIDGE
    for label, session_ids in ids.items():
        assert len(session_ids) == SESSIONS_PER_BRIDGE
        texts = set()
        for session_id in session_ids:
            record = records[session_id]
            assert record.prompt is not None
            assert not record.live  # the bridge that opened it has exited
            assert record.delivered == record.prompt.fingerprint()
            texts.add(record.prompt.text)
        assert texts == {f"{label} {index}" for index in range(SESSIONS_PER_BRIDGE)}
