"""The first-turn adapter: the prompt reaches the agent once per conversation, verbatim.

What counts is what the fake agent read: the prompt block at the head of a
``session/prompt``, exactly once until the session's prompt changes.
"""

from __future__ import annotations

from pathlib import Path

import trio
from harness import (
    AGENT_NAME,
    TIMEOUT,
    FakeAgent,
    Restart,
    bridge_in_process,
    fingerprint,
    in_process_peer,
    joined,
    wire_prompt,
)

from acp_bridge.state.store import SessionStore

PROMPT = ("Rule one.", "  Rule two, indented.\n", "{{ literal }}")
OTHER = ("A different rule.",)


def deliveries(agent: FakeAgent, session_id: str, *texts: str) -> int:
    """How many of the agent's ``session/prompt`` turns for a session carried the prompt."""
    block = {"type": "text", "text": joined(*texts)}
    return sum(blocks.count(block) for blocks in agent.prompts(session_id))


async def test_prompt_block_arrives_once_per_conversation_and_verbatim(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            sid = await peer.new(wire_prompt(*PROMPT))
            for turn in range(4):
                await peer.prompt(sid, f"turn {turn}")
    turns = agent.prompts(sid)
    assert turns[0] == [
        {"type": "text", "text": "Rule one.\n\n  Rule two, indented.\n\n\n{{ literal }}"},
        {"type": "text", "text": "turn 0"},
    ]
    assert [t[-1]["text"] for t in turns] == [f"turn {n}" for n in range(4)]
    assert deliveries(agent, sid, *PROMPT) == 1


async def test_each_session_gets_its_own_first_turn(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            first = await peer.new(wire_prompt(*PROMPT))
            second = await peer.new(wire_prompt(*OTHER))
            plain = await peer.new()
            for session_id in (first, second, plain, first, second, plain):
                await peer.prompt(session_id)
    assert deliveries(agent, first, *PROMPT) == 1
    assert deliveries(agent, second, *OTHER) == 1
    assert deliveries(agent, second, *PROMPT) == 0
    assert agent.prompts(plain) == [[{"type": "text", "text": "hello"}]] * 2


async def test_changed_prompt_is_delivered_again(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            sid = await peer.new(wire_prompt(*PROMPT))
            await peer.prompt(sid)
            await peer.load(sid, wire_prompt(*OTHER))
            await peer.prompt(sid)
            await peer.prompt(sid)
            # Back to the first prompt: it changed again, so it is delivered again.
            await peer.load(sid, wire_prompt(*PROMPT))
            await peer.prompt(sid)
    assert deliveries(agent, sid, *PROMPT) == 2
    assert deliveries(agent, sid, *OTHER) == 1
    assert [len(t) for t in agent.prompts(sid)] == [2, 2, 1, 2]


def test_fingerprint_includes_the_mode() -> None:
    # first-turn only offers append, so only the text can change; the fingerprint includes
    # the mode so a future override-capable first-turn stays correct.
    assert fingerprint("x") != fingerprint("x", mode="override")


async def prompted_before_restart(restart: Restart) -> str:
    """A session with PROMPT that had one turn in the bridge process before the restart."""
    async with restart.before() as peer:
        sid = await peer.new(wire_prompt(*PROMPT))
        await peer.prompt(sid)
    return sid


async def test_not_delivered_again_after_restart_and_load_with_same_prompt(
    tmp_path: Path,
) -> None:
    restart = Restart(tmp_path)
    with trio.fail_after(TIMEOUT):
        sid = await prompted_before_restart(restart)
        async with restart.after() as peer:
            await peer.load(sid, wire_prompt(*PROMPT))
            await peer.prompt(sid)
            await peer.load(sid)
            await peer.prompt(sid)
    assert deliveries(restart.first, sid, *PROMPT) == 1
    assert deliveries(restart.second, sid, *PROMPT) == 0
    with SessionStore(restart.state) as store:
        record = store.get(AGENT_NAME, sid)
    assert record is not None and record.delivered == fingerprint(*PROMPT)


async def test_changed_prompt_after_restart_is_delivered(tmp_path: Path) -> None:
    restart = Restart(tmp_path)
    with trio.fail_after(TIMEOUT):
        sid = await prompted_before_restart(restart)
        async with restart.after() as peer:
            await peer.load(sid, wire_prompt(*OTHER))
            await peer.prompt(sid)
    assert deliveries(restart.second, sid, *OTHER) == 1


async def test_fork_with_same_prompt_does_not_deliver_it_twice(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            sid = await peer.new(wire_prompt(*PROMPT))
            await peer.prompt(sid)
            explicit = await peer.fork(sid, wire_prompt(*PROMPT))
            inherited = await peer.fork(sid)
            for session_id in (explicit, inherited, sid):
                await peer.prompt(session_id)
    # The forks copy a history that already holds the prompt.
    assert deliveries(agent, explicit, *PROMPT) == 0
    assert deliveries(agent, inherited, *PROMPT) == 0
    assert deliveries(agent, sid, *PROMPT) == 1


async def test_fork_before_first_turn_delivers_in_the_fork(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            sid = await peer.new(wire_prompt(*PROMPT))
            fork = await peer.fork(sid)  # the parent never had a turn: nothing to inherit
            await peer.prompt(fork)
            await peer.prompt(fork)
    assert deliveries(agent, fork, *PROMPT) == 1


async def test_fork_with_different_prompt_delivers_the_new_one(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            sid = await peer.new(wire_prompt(*PROMPT))
            await peer.prompt(sid)
            fork = await peer.fork(sid, wire_prompt(*OTHER))
            await peer.prompt(fork)
            await peer.prompt(fork)
    assert deliveries(agent, fork, *OTHER) == 1
    assert deliveries(agent, fork, *PROMPT) == 0


async def test_failed_turn_does_not_count_as_delivered(tmp_path: Path) -> None:
    failing = FakeAgent(tmp_path / "failing.jsonl", fail_methods=["session/prompt"])
    working = FakeAgent(tmp_path / "working.jsonl")
    state = tmp_path / "state.db"
    with trio.fail_after(TIMEOUT):
        with SessionStore(state) as store:
            async with bridge_in_process(failing, store) as peer:
                await peer.initialize()
                sid = await peer.new(wire_prompt(*PROMPT))
                params = {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
                await peer.error("session/prompt", params)
            record = store.get(AGENT_NAME, sid)
            assert record is not None and record.delivered is None
        with SessionStore(state) as store:
            async with bridge_in_process(working, store) as peer:
                await peer.initialize()
                await peer.load(sid)
                await peer.prompt(sid)
    assert deliveries(failing, sid, *PROMPT) == 1
    assert deliveries(working, sid, *PROMPT) == 1


async def test_a_reused_session_id_after_restart_is_a_new_conversation(tmp_path: Path) -> None:
    # The fake agent numbers sessions per process, as some agents do: after a restart
    # session/new hands out the same id again, for a conversation that holds nothing yet.
    restart = Restart(tmp_path)
    with trio.fail_after(TIMEOUT):
        sid = await prompted_before_restart(restart)
        async with restart.after() as peer:
            again = await peer.new(wire_prompt(*PROMPT))
            await peer.prompt(again)
            await peer.prompt(again)
    assert again == sid
    assert deliveries(restart.second, sid, *PROMPT) == 1


def test_store_starts_a_new_conversation_for_a_reused_id(tmp_path: Path) -> None:
    from acp_bridge.core.system_prompt import SystemPrompt
    from acp_bridge.state.lifecycle import Lifecycle

    prompt = SystemPrompt.of_text("append", *PROMPT)
    with SessionStore(tmp_path / "state.db") as store:
        lifecycle = Lifecycle(store, AGENT_NAME)
        lifecycle.save_new("sess-1", prompt, parent_id="old-parent")
        lifecycle.set_delivered("sess-1", prompt.fingerprint())
        lifecycle.save("sess-1", prompt)  # a load keeps the conversation
        assert lifecycle.get("sess-1").delivered == prompt.fingerprint()  # type: ignore[union-attr]
        lifecycle.save_new("sess-1", prompt)  # the id handed out again
        record = lifecycle.get("sess-1")
    assert record is not None
    assert (record.delivered, record.parent_id) == (None, None)
