"""Byte-exact relay: what one side sends is exactly what the other side receives.

A scripted client and the fake agent exchange a few hundred frames of every kind through
the bridge CLI; both ends record their bytes and the recordings are compared whole.
"""

# ruff: noqa: E501, UP031  (hand-written wire frames: one per line, filled in with %)

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from conftest import OpenBridge, RunningBridge
from schema import validate_initialize_response

BIG = 20 * 1024 * 1024
ROUNDS = 40

# Frames written by hand: odd whitespace, unusual key order, unicode escaped and not.
CLIENT_NOTIFICATIONS = [
    '{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s-1"}}',
    '{ "jsonrpc" : "2.0" ,\t"method" :\t"_zed/ping" , "params" : { "n" : 1 } }',
    '{"params":{"_meta":{"trace":"t-1","nested":{"k":[1,2,{"z":null}]}}},"method":"_vendor/note","jsonrpc":"2.0"}',
    '{"jsonrpc":"2.0","method":"unknown/thing","params":{"text":"\\ud83d\\ude00 \\u00fc \\u2028 \\u0000"}}',
    '{"jsonrpc":"2.0","method":"unknown/thing","params":{"text":"😀 𝄞 ü \u2028 ﷽ e\u0301"}}',
    '{"jsonrpc":"2.0","method":"x","params":[1, 2.50, -0, 1e3, true, false, null]}',
]

AGENT_LINES = [
    '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi 😀"}}}}',
    '{ "method" : "_goose/event" ,\t"jsonrpc":"2.0", "params":{"_meta":{"a":1}} }',
    '{"jsonrpc":"2.0","method":"session/update","params":{"text":"\\ud834\\udd1e escaped, 𝄞 raw"}}',
    '{"params":{},"jsonrpc":"2.0","method":"unknown/agent_note"}',
]


def agent_request(request_id: str) -> str:
    return (
        '{"id":"%s", "jsonrpc":"2.0","method":"fs/read_text_file",'
        '"params":{"sessionId":"s-1","path":"/tmp/ü.txt","_meta":{"x":true}}}' % request_id
    )


def client_response(request_id: Any) -> str:
    return (
        '{ "result" : {"content":"ok 😀 \\u00e9", "_meta":{"r":1}}, "id" : %s,\t"jsonrpc":"2.0" }'
        % json.dumps(request_id)
    )


class ScriptedClient:
    """Sends the script, answers the agent's requests, and tracks what is still owed."""

    def __init__(self, bridge: RunningBridge) -> None:
        self.bridge = bridge
        self.awaiting: set[Any] = set()  # our request ids not yet answered
        self.answered_agent = 0
        self.all_answered = trio.Event()
        self.script_done = False
        self.big_echo: Any = None

    async def request(self, request_id: Any, line: str) -> None:
        self.awaiting.add(request_id)
        await self.bridge.send_line(line.encode())

    def _settled(self, message: Any) -> None:
        if isinstance(message, dict) and "method" not in message:
            self.awaiting.discard(message.get("id"))
        if self.script_done and not self.awaiting:
            self.all_answered.set()

    async def read(self) -> None:
        while (line := await self.bridge.receive_line()) is not None:
            message = json.loads(line)
            if isinstance(message, list):
                requests = [m for m in message if "method" in m and "id" in m]
                if requests:
                    batch = ", ".join(client_response(m["id"]) for m in requests)
                    await self.bridge.send_line(f"[ {batch} ]".encode())
                    self.answered_agent += len(requests)
                for member in message:
                    self._settled(member)
                continue
            if "method" in message and "id" in message:
                await self.bridge.send_line(client_response(message["id"]).encode())
                self.answered_agent += 1
            elif message.get("id") == "big":
                self.big_echo = message
            self._settled(message)

    async def run_script(self) -> None:
        for i in range(ROUNDS):
            await self.request(
                i,
                '{"jsonrpc":"2.0","id":%d,"method":"_test/echo","params":{"i":%d,"_meta":{"m":"ü"}}}'
                % (i, i),
            )
            for line in CLIENT_NOTIFICATIONS:
                await self.bridge.send_line(line.encode())
            await self.request(
                f"u-{i}", '{"id":"u-%d","method":"_vendor/unknown","jsonrpc":"2.0","params":{}}' % i
            )
            await self.request(
                f"n-{i}", '{ "jsonrpc":"2.0", "id":"n-%d", "method":"no/such/method" }' % i
            )
            lines = [*AGENT_LINES, agent_request(f"agent-{i}")]
            if i % 4 == 0:
                lines.append("[%s, %s]" % (AGENT_LINES[0], agent_request(f"agent-batch-{i}")))
            emit = {
                "jsonrpc": "2.0",
                "id": f"e-{i}",
                "method": "_test/emit",
                "params": {"lines": lines},
            }
            await self.request(f"e-{i}", json.dumps(emit, ensure_ascii=i % 2 == 0))
            await self.request(
                f"ask-{i}",
                '{"jsonrpc":"2.0","id":"ask-%d","method":"_test/ask_client","params":{"id":%d}}'
                % (i, 1000 + i),
            )
            if i % 5 == 0:
                await self.request(
                    f"b1-{i}",
                    '[{"jsonrpc":"2.0","id":"b1-%d","method":"_x/batched"},'
                    ' {"jsonrpc":"2.0","method":"_x/note","params":{}},'
                    '{"jsonrpc":"2.0","id":"b2-%d","method":"_x/batched","params":{"_meta":{}}}]'
                    % (i, i),
                )
                self.awaiting.add(f"b2-{i}")
            if i == ROUNDS // 2:
                payload = "😀x" * (BIG // 5)  # 5 bytes each: 20 MiB of UTF-8
                line = '{"jsonrpc":"2.0","id":"big","method":"_test/echo","params":{"blob":"%s"}}'
                await self.request("big", line % payload)
        self.script_done = True
        self._settled(None)


# Without a configuration file the bridge answers initialize before it has loaded and
# then replays that exchange (acp_bridge.runtime.early_initialize): the bytes must not change.
EARLY = pytest.mark.parametrize("config_file", [True, False], ids=["config", "early"])


@EARLY
async def test_every_frame_arrives_byte_for_byte_in_both_directions(
    open_bridge: OpenBridge, config_file: bool
) -> None:
    with trio.fail_after(120):
        async with open_bridge(config_file=config_file) as bridge:
            client = ScriptedClient(bridge)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.read)
                await client.run_script()
                await client.all_answered.wait()
                await bridge.close_stdin()
            assert await bridge.wait() == 0

    agent_received = bridge.file("agent-received").read_bytes()
    agent_sent = bridge.file("agent-sent").read_bytes()
    assert agent_received == bytes(bridge.sent)
    assert bytes(bridge.received) == agent_sent
    # The transcript really was a few hundred frames, with a 20 MiB one each way.
    assert agent_received.count(b"\n") > 400
    assert agent_sent.count(b"\n") > 400
    assert client.answered_agent == ROUNDS * 2 + ROUNDS // 4
    assert client.big_echo is not None
    assert len(client.big_echo["result"]["blob"]) == 2 * (BIG // 5)
    assert max(map(len, agent_received.splitlines())) > BIG
    assert max(map(len, agent_sent.splitlines())) > BIG


@EARLY
async def test_changed_initialize_response_is_valid_json_and_the_rest_stays_exact(
    open_bridge: OpenBridge, config_file: bool
) -> None:
    initialize = (
        '{ "jsonrpc":"2.0", "id":0, "method":"initialize", "params":{"protocolVersion":1,'
        '"clientCapabilities":{"fs":{"readTextFile":true}},"_meta":{"ü":"😀"}} }'
    )
    later = '{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{ "a" : "\\u00fc" }}'
    with trio.fail_after(30):
        async with open_bridge(config_file=config_file) as bridge:
            await bridge.send_line(initialize.encode())
            init_line = await bridge.receive_line()
            await bridge.send_line(later.encode())
            echo_line = await bridge.receive_line()
            await bridge.close_stdin()
            assert await bridge.read_to_eof() == []
            assert await bridge.wait() == 0

    assert init_line is not None and echo_line is not None
    response = json.loads(init_line)
    validate_initialize_response(response, version=1)
    assert response["id"] == 0
    assert "agentCapabilities" in response["result"]
    sent_lines = bridge.file("agent-sent").read_bytes().splitlines()
    assert echo_line == sent_lines[1]
    # The request itself was not changed, so the agent got the client's bytes.
    assert bridge.file("agent-received").read_bytes() == bytes(bridge.sent)
