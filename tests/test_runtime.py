"""The trio runtime over in-memory agents: no process, and trio's MockClock for time."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from memory_agent import MemoryAgent, MemorySpawner
from test_ids import Wire

from acp_bridge.adapter import AdapterContext
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.registry import AdapterRegistry
from acp_bridge.runtime.pumps import (
    READ_CHUNK,
    WAITING_AGENT_BYTES,
    WAITING_AGENT_FRAMES,
    WAITING_CLIENT_BYTES,
    WAITING_CLIENT_FRAMES,
)
from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore, StoreError

USER_ADAPTERS = Path(__file__).with_name("adapters")
PROMPT = {"mode": "append", "content": [{"type": "text", "text": "Be brief."}]}
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


@asynccontextmanager
async def bridge_over_memory(
    lifecycle: Lifecycle | None = None,
    *,
    adapter_folders: Sequence[Path] = (USER_ADAPTERS,),
    agent_name: str = "memory-agent",
    agent_options: dict[str, Any] | None = None,
    initialize: bool = True,
    **options: Any,
) -> AsyncIterator[tuple[Wire, MemoryAgent]]:
    """A bridge in front of a memory agent; ``initialize``: exchanged before the body."""
    async with memory_bridge(
        lifecycle,
        adapter_folders=adapter_folders,
        agent_name=agent_name,
        agent_options=agent_options,
        initialize=initialize,
        **options,
    ) as (_bridge, client, agent):
        yield client, agent


@asynccontextmanager
async def memory_bridge(
    lifecycle: Lifecycle | None = None,
    *,
    adapter_folders: Sequence[Path] = (USER_ADAPTERS,),
    agent_name: str = "memory-agent",
    agent_options: dict[str, Any] | None = None,
    initialize: bool = True,
    **options: Any,
) -> AsyncIterator[tuple[Bridge, Wire, MemoryAgent]]:
    """:func:`bridge_over_memory`, with the bridge itself for a test that looks inside it."""
    to_bridge_send, to_bridge_receive = trio.testing.memory_stream_one_way_pair()
    from_bridge_send, from_bridge_receive = trio.testing.memory_stream_one_way_pair()
    store = SessionStore(":memory:")
    async with trio.open_nursery() as nursery:
        spawner = MemorySpawner(nursery, name=agent_name, **(agent_options or {}))
        bridge = Bridge(
            BridgeOptions(agent_argv=["memory-agent"], shutdown_grace=0.5, **options),
            to_bridge_receive,
            from_bridge_send,
            lifecycle or Lifecycle(store, "memory-agent"),
            registry=AdapterRegistry(adapter_folders),
            spawner=spawner,
        )
        finished = trio.Event()

        async def run() -> None:
            await bridge.run(watch_signals=False)
            finished.set()

        nursery.start_soon(run)
        client = Wire(to_bridge_send, from_bridge_receive)
        if initialize:
            await client.send(INITIALIZE)
            advertised = await client.receive()
            if advertised["result"]["protocolVersion"] == 2:
                assert "systemPrompt" in advertised["result"]["capabilities"]["session"]
            else:
                caps = advertised["result"]["agentCapabilities"]
                assert "systemPrompt" in caps["sessionCapabilities"]
        else:
            await trio.testing.wait_all_tasks_blocked()  # the agent started
        yield bridge, client, spawner.agents[0]
        await to_bridge_send.aclose()
        # Read what is left, as a client does, until the bridge has finished.
        async with trio.open_nursery() as draining:
            draining.start_soon(drain, from_bridge_receive)
            await finished.wait()
            draining.cancel_scope.cancel()
    store.close()


async def drain(stream: trio.abc.ReceiveStream) -> None:
    while await stream.receive_some(1 << 20):
        pass


def new_session(request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "session/new",
            "params": {"cwd": "/", "mcpServers": [], "systemPrompt": PROMPT}}  # fmt: skip


async def test_a_hook_held_two_seconds_holds_up_only_its_own_session(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(5):
        async with bridge_over_memory(adapter="slow") as (client, agent):
            start = trio.current_time()
            await client.send(new_session("held"))
            await trio.testing.wait_all_tasks_blocked()
            # A request for another session.
            await client.send({"jsonrpc": "2.0", "id": "other", "method": "_test/echo",
                               "params": {"sessionId": "sess-9"}})  # fmt: skip
            assert (await client.receive())["id"] == "other"
            # A permission answer: the agent asks, the client answers, the agent replies.
            ask = {"id": "perm", "method": "session/request_permission"}
            await client.send({"jsonrpc": "2.0", "id": "ask", "method": "_test/ask_client",
                               "params": ask})  # fmt: skip
            asked = await client.receive()
            assert asked["method"] == "session/request_permission"
            await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"outcome": "ok"}})
            assert await client.receive() == {"jsonrpc": "2.0", "id": "ask",
                                              "result": {"outcome": "ok"}}  # fmt: skip
            # A cancel for another session.
            await client.send({"jsonrpc": "2.0", "method": "session/cancel",
                               "params": {"sessionId": "sess-9"}})  # fmt: skip
            await trio.testing.wait_all_tasks_blocked()
            assert {"jsonrpc": "2.0", "method": "session/cancel",
                    "params": {"sessionId": "sess-9"}} in agent.received  # fmt: skip
            assert trio.current_time() - start < 0.1
            assert not any(m.get("method") == "session/new" for m in agent.received)
            mock_clock.jump(2)
            answer = await client.receive()
            assert answer["id"] == "held" and answer["result"]["sessionId"] == "sess-1"


class BrokenLifecycle(Lifecycle):
    """A store file that fails to record a session, after ``release`` is set (another
    process holds its lock)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(SessionStore(folder / "sessions.sqlite3"), "memory-agent")
        self.release = threading.Event()

    def save(
        self, session_id: str, prompt: SystemPrompt | None, *, parent_id: str | None = None
    ) -> None:
        self.release.wait(10)
        raise StoreError("sessions.sqlite3: database is locked")

    save_new = save


async def assert_refused_and_closed_on_the_agent(client: Wire, agent: MemoryAgent) -> None:
    """session/new ("new") is answered with an internal error, and the session the agent
    opened for it is closed there."""
    answer = await client.receive()
    assert answer["id"] == "new" and answer["error"]["code"] == -32603
    await trio.testing.wait_all_tasks_blocked()
    closes = [m for m in agent.received if m.get("method") == "session/close"]
    assert [c["params"] for c in closes] == [{"sessionId": "sess-1"}]


async def test_a_store_that_fails_during_session_new_leaves_no_session_open(
    tmp_path: Path,
) -> None:
    lifecycle = BrokenLifecycle(tmp_path)
    with trio.fail_after(10):
        async with bridge_over_memory(lifecycle) as (client, agent):
            await client.send(new_session("new"))
            # The store is stuck: other traffic still flows.
            await client.send({"jsonrpc": "2.0", "id": "other", "method": "_test/echo",
                               "params": {}})  # fmt: skip
            assert (await client.receive())["id"] == "other"
            lifecycle.release.set()
            await assert_refused_and_closed_on_the_agent(client, agent)


async def test_a_store_failure_in_version_2_closes_the_session_the_agent_opened(
    tmp_path: Path,
) -> None:
    # Version 2 has no close capability: close is a baseline method of capabilities.session.
    lifecycle = BrokenLifecycle(tmp_path)
    lifecycle.release.set()
    agent_options = {"protocol_version": 2, "session_capabilities": {}}
    with trio.fail_after(10):
        async with bridge_over_memory(lifecycle, agent_options=agent_options) as (client, agent):
            await client.send(new_session("new"))
            await assert_refused_and_closed_on_the_agent(client, agent)


@pytest.mark.parametrize("method", ["session/new", "session/load", "session/resume"])
async def test_an_adapter_step_that_fails_after_the_agent_opened_the_session_closes_it(
    method: str,
) -> None:
    # Spec §6: a failed delivery (the adapter's step) leaves no session behind; the bridge
    # ends the one the agent already opened for the request before the client hears.
    store = SessionStore(":memory:")
    params: dict[str, Any] = {"cwd": "/", "mcpServers": [], "systemPrompt": PROMPT}
    if method != "session/new":
        params["sessionId"] = "sess-7"
    lifecycle = Lifecycle(store, "memory-agent")
    with trio.fail_after(10):
        async with bridge_over_memory(lifecycle, adapter="broken-step") as (client, agent):
            await client.send({"jsonrpc": "2.0", "id": "open", "method": method,
                               "params": params})  # fmt: skip
            answer = await client.receive()
            closes = [m["params"] for m in agent.received if m.get("method") == "session/close"]
    assert answer["id"] == "open" and answer["error"]["code"] == -32603
    assert closes == [{"sessionId": "sess-1" if method == "session/new" else "sess-7"}]
    assert store.list() == []
    store.close()


async def test_a_close_the_agent_answers_not_found_leaves_the_session_not_live() -> None:
    store = SessionStore(":memory:")
    not_found = {"code": -32002, "message": "Session not found"}
    with trio.fail_after(10):
        async with bridge_over_memory(
            Lifecycle(store, "memory-agent"), agent_options={"close_error": not_found}
        ) as (client, _agent):
            await client.send(new_session("new"))
            assert (await client.receive())["result"] == {"sessionId": "sess-1"}
            await client.send({"jsonrpc": "2.0", "id": "close", "method": "session/close",
                               "params": {"sessionId": "sess-1"}})  # fmt: skip
            answer = await client.receive()
            assert answer == {"jsonrpc": "2.0", "id": "close", "error": not_found}
            record = store.get("memory-agent", "sess-1")
            assert record is not None and not record.live
    store.close()


async def test_sessions_are_stored_under_the_name_the_agent_gives_itself() -> None:
    # Spec §6: keyed by (agent identity, session id); the command's name stands in only
    # until the agent's initialize answer names the agent.
    store = SessionStore(":memory:")
    with trio.fail_after(10):
        async with bridge_over_memory(
            Lifecycle(store, "memory-agent"), agent_name="agent-own-name"
        ) as (client, _agent):
            await client.send(new_session("new"))
            assert (await client.receive())["result"] == {"sessionId": "sess-1"}
    record = store.get("agent-own-name", "sess-1")
    assert record is not None and record.prompt is not None
    assert record.prompt.text == "Be brief."
    assert store.get("memory-agent", "sess-1") is None
    store.close()


async def receive_line(client: Wire) -> bytes:
    """The next line the client gets, as bytes."""
    while b"\n" not in client.buffer:
        client.buffer += await client.receive_stream.receive_some(1 << 16)
    line, client.buffer = client.buffer.split(b"\n", 1)
    return line


async def test_modes_config_options_and_tools_pass_as_the_agent_and_client_sent_them() -> None:
    # Spec §6: the bridge never changes tool availability, MCP servers, permissions, modes
    # or config options: the agent's answer to an intercepted session/new keeps its bytes,
    # and the requests that change a session's mode or options are not the bridge's.
    answer = (
        b'{"jsonrpc":"2.0","id":{id},"result":{"sessionId":"sess-1",'
        b'"modes":{"currentModeId":"ask","availableModes":[{"id":"ask","name":"Ask"}]},'
        b'"configOptions":[{"id":"model","name":"Model","type":"select",'
        b'"currentValue":"small","options":[{"value":"small","name":"Small"}]}]}}'
    )
    server = {"name": "fs", "command": "mcp-fs", "args": [], "env": []}
    steering = [
        b'{"jsonrpc":"2.0","id":"mode","method":"session/set_mode",'
        b'"params":{"sessionId":"sess-1", "modeId":"code"}}',
        b'{"jsonrpc":"2.0","id":"option","method":"session/set_config_option",'
        b'"params":{"sessionId":"sess-1","configId":"model",  "value":"large"}}',
    ]
    agent_options = {"session_new_answer": answer}
    with trio.fail_after(10):
        async with bridge_over_memory(agent_options=agent_options) as (client, agent):
            await client.send({"jsonrpc": "2.0", "id": "new", "method": "session/new",
                               "params": {"cwd": "/", "mcpServers": [server],
                                          "systemPrompt": PROMPT}})  # fmt: skip
            assert await receive_line(client) == answer.replace(b"{id}", b'"new"')
            for line in steering:
                await client.send_stream.send_all(line + b"\n")
                assert json.loads(await receive_line(client))["id"] == json.loads(line)["id"]
    (sent,) = [m for m in agent.received if m.get("method") == "session/new"]
    assert sent["params"] == {"cwd": "/", "mcpServers": [server]}
    assert agent.received_raw[-2:] == steering


async def test_configured_by_file_a_slow_user_adapter_holds_up_only_its_session(
    open_memory_bridge: Any,
) -> None:
    config = {"adapter_paths": [str(USER_ADAPTERS)], "adapter": "slow"}
    with trio.fail_after(20):
        async with open_memory_bridge(config=config) as bridge:
            await bridge.request(0, "initialize", {"protocolVersion": 1})
            await bridge.receive()
            await bridge.send(new_session("held"))
            await trio.sleep(0.2)  # the hook is now holding session/new (for 2 s)
            started = trio.current_time()
            await bridge.request("other", "_test/echo", {"sessionId": "sess-9"})
            assert (await bridge.receive())["id"] == "other"
            ask = {"id": "perm", "method": "session/request_permission"}
            await bridge.request("ask", "_test/ask_client", ask)
            asked = await bridge.receive()
            await bridge.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"outcome": "ok"}})
            assert (await bridge.receive())["id"] == "ask"
            elapsed = trio.current_time() - started
            assert elapsed < 0.1, f"unrelated traffic waited {elapsed:.3f} s"
            answer = await bridge.receive()
            assert answer["id"] == "held" and "result" in answer


async def test_an_agent_that_cannot_start_answers_initialize_with_the_cause(
    open_bridge: Any,
) -> None:
    with trio.fail_after(20):
        async with open_bridge(agent_argv=["/no/such/agent", "--acp"]) as bridge:
            await bridge.request(1, "initialize", {"protocolVersion": 1})
            answer = await bridge.receive()
            assert answer["id"] == 1
            assert "/no/such/agent" in answer["error"]["message"]
            assert "No such file" in answer["error"]["message"]
            assert answer["error"]["data"]["command"] == "/no/such/agent"
            assert "--acp" not in json.dumps(answer)  # arguments may hold prompt text
            assert await bridge.process.wait() != 0


@pytest.mark.parametrize(
    ("key", "bad_content", "field"),
    [
        # An older client's spelling: validated where it was sent.
        ("systemPrompt", [], "_meta.systemPrompt.content"),
        # The Python SDK's spelling.
        ("system_prompt", [{"type": "image"}], "_meta.system_prompt.content[0].type"),
    ],
)
async def test_a_prompt_in_meta_is_validated_where_it_was_sent_and_delivered(
    key: str, bad_content: list[Any], field: str
) -> None:
    with trio.fail_after(5):
        async with bridge_over_memory() as (client, agent):
            bad = {key: {"mode": "append", "content": bad_content}, "other": 1}
            await client.send({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                               "params": {"cwd": "/", "mcpServers": [], "_meta": bad}})  # fmt: skip
            refused = await client.receive()
            assert refused["error"]["code"] == -32602
            assert refused["error"]["data"] == {"field": field}
            good = {key: PROMPT, "other": 1}
            params = {"cwd": "/", "mcpServers": [], "_meta": good}
            await client.send({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                               "params": params})  # fmt: skip
            assert (await client.receive())["result"]["sessionId"] == "sess-1"
    (sent,) = [m for m in agent.received if m.get("method") == "session/new"]
    assert sent["params"]["_meta"] == {"other": 1}


async def test_what_the_agent_sends_after_an_intercepted_answer_reaches_the_client_after_it() -> (
    None
):
    # The agent answers session/new and at once sends the new session's commands (as
    # claude-agent-acp does). The bridge records the session before it answers; the update
    # must not overtake that answer, or the client sees a session it does not know yet.
    async with bridge_over_memory(agent_options={"commands_after_new": True}) as (client, _):
        for request_id in (1, 2, 3):
            await client.send(new_session(request_id))
            answer = await client.receive()
            update = await client.receive()
            assert answer["id"] == request_id, answer
            assert update["params"]["sessionId"] == answer["result"]["sessionId"]


async def test_an_adapter_is_lent_the_adapter_context_and_nothing_else_of_the_bridge() -> None:
    with trio.fail_after(10):
        async with memory_bridge(adapter_folders=()) as (bridge, _client, _agent):
            assert bridge.adapter is not None
            context = bridge.adapter.context
            interface = {name for name in vars(AdapterContext) if not name.startswith("_")}
            interface |= set(AdapterContext.__annotations__)
            assert {name for name in dir(context) if not name.startswith("_")} == interface
            assert context.primary is bridge.primary


async def test_after_the_client_left_frames_behind_an_interception_go_as_it_is_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The client's EOF while ``initialize`` is intercepted: what waits behind it reaches
    the agent the moment it is answered, with no time passing (nothing polls)."""
    answer_initialize = trio.Event()
    with trio.fail_after(5):
        async with bridge_over_memory(
            initialize=False, agent_options={"initialize_gate": answer_initialize}
        ) as (client, agent):
            start = trio.current_time()
            await client.send(INITIALIZE)
            await client.send({"jsonrpc": "2.0", "id": "behind", "method": "_test/echo",
                               "params": {}})  # fmt: skip
            await client.send_stream.aclose()
            await trio.testing.wait_all_tasks_blocked()
            assert [message["method"] for message in agent.received] == ["initialize"]
            answer_initialize.set()
            assert (await client.receive())["id"] == 0
            assert await client.receive() == {"jsonrpc": "2.0", "id": "behind", "result": {}}
    assert trio.current_time() == start
    assert [message["method"] for message in agent.received] == ["initialize", "_test/echo"]


async def test_an_interception_open_when_the_agent_exits_is_answered_before_the_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The agent exits while a hook still runs: the bridge ends once the hook's answer is
    out, with no time passing (nothing polls)."""
    before = trio.Event()
    with trio.fail_after(5):
        async with bridge_over_memory(
            adapter="lingering", adapter_options={"lingering": {"before": before}}
        ) as (client, agent):
            start = trio.current_time()
            await client.send(new_session("held"))
            await trio.testing.wait_all_tasks_blocked()
            agent.exit(1)
            await trio.testing.wait_all_tasks_blocked()
            before.set()
            answer = await client.receive()
            assert answer["id"] == "held"
            assert answer["error"]["data"] == {"exitStatus": 1}
    assert trio.current_time() == start


@pytest.mark.parametrize(
    "answer",
    [
        b'{"jsonrpc":"2.0","id":{id},"result":{"sessionId":"s","n":NaN}}',
        b'{"jsonrpc":"2.0","id":{id},"result":{"sessionId":"s\x01"}}',
    ],
    ids=["nan", "control-character"],
)
async def test_an_invalid_answer_to_an_intercepted_request_is_an_error_not_a_wait(
    answer: bytes,
) -> None:
    # The agent answers the forwarded session/new with a line that is not JSON-RPC: it is
    # dropped, and the client hears at once that no answer will come (not when the agent
    # exits, as it did).
    agent_options = {"session_new_answer": answer}
    with trio.fail_after(10):
        async with bridge_over_memory(agent_options=agent_options) as (client, _agent):
            await client.send(new_session("new"))
            refused = await client.receive()
            # The bridge still serves.
            await client.send({"jsonrpc": "2.0", "id": "after", "method": "_test/echo",
                               "params": {}})  # fmt: skip
            assert (await client.receive())["id"] == "after"
    assert refused["id"] == "new", refused
    assert refused["error"]["code"] == -32603, refused
    assert "answer" in refused["error"]["message"]


@pytest.mark.parametrize(
    ("count", "padding"),
    [(20_000, 0), (64, 100_000)],
    ids=["many small frames", "fewer large ones"],
)
async def test_the_client_is_read_no_further_while_too_much_of_it_waits(
    autojump_clock: trio.testing.MockClock, count: int, padding: int
) -> None:
    """Every client frame waits behind an intercepted ``initialize``. A client that wrote
    on while the agent took its time made the bridge hold all of it (50 MiB of small
    notifications behind a slow agent: 288 MiB more). The bridge stops reading the client
    while more than a bound waits, as a pipe stops a writer its reader does not keep up
    with (so many bytes, or so many frames: a small one is kept as about 15 times its
    bytes), and reads on as the frames go; nothing is lost or reordered."""
    answer_initialize = trio.Event()
    pad = b"x" * padding
    notes = [
        b'{"jsonrpc":"2.0","method":"_x/note","params":{"n":%d,"pad":"%s"}}\n' % (n, pad)
        for n in range(count)
    ]
    data = b"".join(notes)  # 1.1 MiB in 20,000 frames, or 6.1 MiB in 64
    with trio.fail_after(30):
        async with memory_bridge(
            initialize=False, agent_options={"initialize_gate": answer_initialize}
        ) as (bridge, client, agent):
            await client.send(INITIALIZE)
            await client.send_stream.send_all(data)
            await trio.testing.wait_all_tasks_blocked()
            # At most one read past either bound.
            gate = bridge.router.gate
            assert gate.waiting <= WAITING_CLIENT_FRAMES + READ_CHUNK // len(notes[0]) + 1
            assert gate.waiting_bytes <= WAITING_CLIENT_BYTES + READ_CHUNK + len(notes[-1])
            answer_initialize.set()
            assert (await client.receive())["id"] == 0
            await client.send({"jsonrpc": "2.0", "id": "after", "method": "_test/echo"})
            assert await client.receive() == {"jsonrpc": "2.0", "id": "after", "result": {}}
    received = [m["params"]["n"] for m in agent.received if m["method"] == "_x/note"]
    assert received == list(range(len(notes)))


# A session/update of the memory agent's flood, without padding.
UPDATE_BYTES = len(
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess-1","update":'
    b'{"sessionUpdate":"agent_message_chunk","n":10000,"pad":""}}}\n'
)


@pytest.mark.parametrize(
    ("count", "padding"),
    # Past either bound by more than one read: 6,000 frames of 144 bytes, or 4.8 MB in 48.
    [(6_000, 0), (48, 100_000)],
    ids=["many small frames", "fewer large ones"],
)
@pytest.mark.parametrize("ask", [False, True], ids=["hook-waits", "hook-asks-the-agent"])
async def test_an_agent_is_read_no_further_while_too_much_of_it_waits_behind_an_answer(
    count: int, padding: int, ask: bool
) -> None:
    """The agent answers session/new and goes on about the new session at once, while the
    bridge's answer waits on the adapter's hook: what the agent sends about that session
    waits for the answer (spec §2), and a bridge that read on held all of it (all 6,000
    frames, or 4.8 MB in 48). The bridge stops reading that agent while more than
    a bound waits, as it stops reading the client, and reads on as the answer goes; unless
    the hook asks the same agent something, whose answer comes after what waits: then it
    reads on. Nothing is lost or reordered."""
    hold = trio.Event()
    options = {"slow": {"delay": 0, "hold_after": hold, "ask_after": ask}}
    with trio.fail_after(30):
        async with memory_bridge(
            adapter="slow",
            adapter_options=options,
            agent_options={"updates_after_new": count, "update_padding": padding},
        ) as (bridge, client, _agent):
            await client.send(new_session("held"))
            await trio.testing.wait_all_tasks_blocked()
            # At most one read past either bound.
            frames, size = bridge.router.answer_hold.held(bridge.primary.hop)
            one_read = READ_CHUNK // UPDATE_BYTES + 1 if padding == 0 else 2
            assert 0 < frames <= WAITING_AGENT_FRAMES + one_read
            assert size <= WAITING_AGENT_BYTES + READ_CHUNK + UPDATE_BYTES + padding
            hold.set()
            answer = await client.receive()
            assert answer["id"] == "held" and answer["result"]["sessionId"] == "sess-1"
            if ask:
                assert answer["result"]["_meta"] == {"asked": {"asked": "after"}}
            updates = [await client.receive() for _ in range(count)]
            await client.send({"jsonrpc": "2.0", "id": "after", "method": "_test/echo"})
            assert await client.receive() == {"jsonrpc": "2.0", "id": "after", "result": {}}
    assert [u["params"]["update"]["n"] for u in updates] == list(range(count))
    assert {u["params"]["sessionId"] for u in updates} == {"sess-1"}


async def test_an_agent_held_back_that_exits_is_read_to_its_end_at_once() -> None:
    """What an agent leaves when it exits is read at once, bound or not: a pump that waited
    for the bridge's answer would otherwise see the exit only once that answer went."""
    hold = trio.Event()
    count = 6_000
    with trio.fail_after(30):
        async with memory_bridge(
            adapter="slow",
            adapter_options={"slow": {"delay": 0, "hold_after": hold}},
            agent_options={"updates_after_new": count},
        ) as (bridge, client, agent):
            await client.send(new_session("held"))
            await trio.testing.wait_all_tasks_blocked()
            hop = bridge.primary.hop
            assert bridge.router.answer_hold.held(hop)[0] < count
            agent.exit(3)
            await trio.testing.wait_all_tasks_blocked()
            assert bridge.router.answer_hold.held(hop)[0] == count
            hold.set()
            assert (await client.receive())["id"] == "held"
            updates = [await client.receive() for _ in range(count)]
    assert [u["params"]["update"]["n"] for u in updates] == list(range(count))
