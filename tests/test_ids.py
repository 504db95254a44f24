"""Id spaces: the bridge's own requests and a second agent never collide with ids in flight.

The bridge runs in this process in front of the fake agent run as a coroutine.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.testing
from memory_agent import ScriptedSpawner

from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore

FAKE_AGENT = Path(__file__).with_name("fake_agent.py")


class Wire:
    """The client's end of an in-process bridge, speaking raw lines."""

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self.send_stream = send
        self.receive_stream = receive
        self.buffer = b""

    async def send(self, message: Any) -> None:
        await self.send_stream.send_all(json.dumps(message).encode() + b"\n")

    async def receive(self) -> Any:
        while b"\n" not in self.buffer:
            self.buffer += await self.receive_stream.receive_some(1 << 16)
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


@asynccontextmanager
async def running_bridge(record: Path) -> AsyncIterator[tuple[Bridge, Wire]]:
    to_bridge_send, to_bridge_receive = trio.testing.memory_stream_one_way_pair()
    from_bridge_send, from_bridge_receive = trio.testing.memory_stream_one_way_pair()
    options = BridgeOptions(
        agent_argv=[sys.executable, str(FAKE_AGENT), "--record", str(record)],
        adapter="passthrough",
        shutdown_grace=0.3,
    )
    store = SessionStore(":memory:")
    async with trio.open_nursery() as nursery:
        bridge = Bridge(
            options,
            to_bridge_receive,
            from_bridge_send,
            Lifecycle(store, "fake"),
            spawner=ScriptedSpawner(nursery),
        )
        nursery.start_soon(partial(bridge.run, watch_signals=False))
        wire = Wire(to_bridge_send, from_bridge_receive)
        await wire.send({"jsonrpc": "2.0", "id": "warm", "method": "_test/echo", "params": {}})
        assert (await wire.receive())["id"] == "warm"
        yield bridge, wire
        await to_bridge_send.aclose()
    store.close()


def received(record: Path) -> list[Any]:
    return [json.loads(line) for line in record.read_bytes().splitlines()]


async def test_bridge_request_skips_client_id_in_flight(tmp_path: Path) -> None:
    record = tmp_path / "agent-received"
    with trio.fail_after(30):
        async with running_bridge(record) as (bridge, wire):
            client_hold = {"jsonrpc": "2.0", "id": "acp-bridge-1", "method": "_test/hold",
                           "params": {"from": "client"}}  # fmt: skip
            await wire.send(client_hold)
            await wire.send({"jsonrpc": "2.0", "id": "sync", "method": "_test/echo", "params": {}})
            assert (await wire.receive())["id"] == "sync"
            own_result: list[Any] = []

            async def own_request() -> None:
                own_result.append(await bridge.primary.request("_test/hold", {"from": "bridge"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(own_request)
                await wire.send({"jsonrpc": "2.0", "id": "sync2", "method": "_test/echo"})
                assert (await wire.receive())["id"] == "sync2"
                await wire.send({"jsonrpc": "2.0", "id": "go", "method": "_test/release"})
                answers = [await wire.receive(), await wire.receive()]
            assert own_result == [{"from": "bridge"}]
            assert answers == [
                {"jsonrpc": "2.0", "id": "acp-bridge-1", "result": {"from": "client"}},
                {"jsonrpc": "2.0", "id": "go", "result": {}},
            ]
    holds = [m for m in received(record) if m.get("method") == "_test/hold"]
    assert [m["id"] for m in holds] == ["acp-bridge-1", "acp-bridge-2"]


async def test_colliding_client_id_is_translated_and_cancel_follows_it(tmp_path: Path) -> None:
    record = tmp_path / "agent-received"
    with trio.fail_after(30):
        async with running_bridge(record) as (bridge, wire):
            own_result: list[Any] = []

            async def own_request() -> None:
                own_result.append(await bridge.primary.request("_test/hold", {"from": "bridge"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(own_request)
                await trio.testing.wait_all_tasks_blocked()
                assert "acp-bridge-1" in bridge.router.hops[bridge.primary.hop].pending
                # The client happens to pick the id of the bridge's own request in flight.
                await wire.send({"jsonrpc": "2.0", "id": "acp-bridge-1", "method": "_test/hold",
                                 "params": {"from": "client"}})  # fmt: skip
                await wire.send({"jsonrpc": "2.0", "method": "$/cancel_request",
                                 "params": {"requestId": "acp-bridge-1"}})  # fmt: skip
                cancelled = await wire.receive()
                assert cancelled["id"] == "acp-bridge-1"
                assert cancelled["error"]["code"] == -32800
                await wire.send({"jsonrpc": "2.0", "id": "go", "method": "_test/release"})
                assert await wire.receive() == {"jsonrpc": "2.0", "id": "go", "result": {}}
            assert own_result == [{"from": "bridge"}]
    messages = received(record)
    client_hold = next(m for m in messages if m.get("params") == {"from": "client"})
    cancel = next(m for m in messages if m.get("method") == "$/cancel_request")
    assert client_hold["id"] == "acp-bridge-2"
    assert cancel["params"]["requestId"] == "acp-bridge-2"


async def test_agent_request_ids_are_unique_toward_the_client(tmp_path: Path) -> None:
    record = tmp_path / "agent-received"
    with trio.fail_after(30):
        async with running_bridge(record) as (bridge, wire):
            second = await bridge.spawn_agent()
            results: dict[str, Any] = {}

            async def ask(name: str, link: Any) -> None:
                results[name] = await link.request("_test/ask_client", {"id": 0, "method": "x/y"})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, "primary", bridge.primary)
                first = await wire.receive()
                nursery.start_soon(ask, "second", second)
                other = await wire.receive()
                assert first["method"] == other["method"] == "x/y"
                assert first["id"] != other["id"]
                for request in (other, first):
                    await wire.send({"jsonrpc": "2.0", "id": request["id"],
                                     "result": {"answered": request["id"]}})  # fmt: skip
    # Each agent got the answer to its own request, under the id it chose.
    assert results["primary"]["clientSaid"] == {"jsonrpc": "2.0", "id": 0,
                                                "result": {"answered": first["id"]}}  # fmt: skip
    assert results["second"]["clientSaid"] == {"jsonrpc": "2.0", "id": 0,
                                               "result": {"answered": other["id"]}}  # fmt: skip
