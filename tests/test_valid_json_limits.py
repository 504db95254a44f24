"""Valid JSON that Python's json cannot build (integers beyond int()'s 4,300 digits, nesting
beyond the recursion limit) is relayed, by one rule for both sides and both lengths: what
the router passes on unchanged goes through byte for byte, and what it would have to read
or change is answered with the request's id and a message naming the limit. Lines that
are not valid are answered with the request's id whenever the line named one first.

In memory (tests/memory_agent.py); the agent's own json cannot read these lines either,
so what it received is checked on its raw input.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from test_long_lines import read_line, send_in_pieces
from test_runtime import PROMPT, bridge_over_memory

from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import DEFAULT_STREAM_AFTER as STREAM_AFTER

DEEP = 5_000
HUGE = "7" * 5_000


def deep(levels: int = DEEP) -> bytes:
    return b'{"d":' * levels + b"0" + b"}" * levels


def padded(params: bytes, long: bool) -> bytes:
    """``params`` as the last member of an object, padded past STREAM_AFTER if ``long``."""
    pad = b'"pad":"' + b"p" * (STREAM_AFTER + 1000) + b'",' if long else b""
    return b"{" + pad + b'"v":' + params + b"}"


LENGTHS = pytest.mark.parametrize("long", [False, True], ids=["short", "long"])
VALUES = pytest.mark.parametrize(
    "value", [deep(), HUGE.encode(), b"-" + HUGE.encode() + b".5e-3"], ids=["deep", "int", "num"]
)


@LENGTHS
@VALUES
async def test_valid_json_the_bridge_need_not_read_goes_on_byte_for_byte(
    long: bool, value: bytes
) -> None:
    params = padded(value, long)
    request = b'{"jsonrpc":"2.0","id":"r1","method":"_test/hold","params":%s}' % params
    note = b'{"jsonrpc":"2.0","method":"x/note","params":%s}' % params
    with trio.fail_after(20):
        async with bridge_over_memory() as (client, agent):
            await client.send({"jsonrpc": "2.0", "id": "held", "method": "_test/hold"})
            await send_in_pieces(client, request + b"\n" + note + b"\n")
            answer = b'{"jsonrpc":"2.0","id":"held","result":%s}' % params
            update = b'{"jsonrpc":"2.0","method":"session/update","params":%s}' % params
            await agent.send_raw(answer)
            await agent.send_raw(update)
            assert await read_line(client) == answer
            assert await read_line(client) == update
            assert request in agent.received_raw and note in agent.received_raw
            # The agent answers the request (it could not read it itself).
            await agent.send_raw(b'{"jsonrpc":"2.0","id":"r1","result":%s}' % params)
            assert await read_line(client) == b'{"jsonrpc":"2.0","id":"r1","result":%s}' % params


@LENGTHS
async def test_a_request_too_deep_for_the_bridge_to_read_is_answered_with_its_id(
    long: bool,
) -> None:
    meta = padded(deep(), long)
    params = b'{"cwd":"/","mcpServers":[],"_meta":%s,"systemPrompt":%s}' % (
        meta,
        json.dumps(PROMPT).encode(),
    )
    line = b'{"jsonrpc":"2.0","id":"new-1","method":"session/new","params":%s}' % params
    with trio.fail_after(20):
        async with bridge_over_memory() as (client, agent):
            await send_in_pieces(client, line + b"\n")
            error = json.loads(await read_line(client))
            assert error["id"] == "new-1"
            assert error["error"]["code"] == jsonrpc.INVALID_REQUEST
            assert "900 levels" in error["error"]["message"]
            assert not [m for m in agent.received if m.get("method") == "session/new"]
            await client.send({"jsonrpc": "2.0", "id": 2, "method": "_test/echo", "params": {}})
            assert json.loads(await read_line(client))["id"] == 2


@pytest.mark.parametrize(
    ("line", "request_id"),
    [
        (b'{"jsonrpc":"2.0","id":7,"method":"x","params":{"t":"\xff"}}', 7),
        (b'{"jsonrpc":"2.0","id":"u","method":"x","params":{"t":"\x01"}}', "u"),
        (b'{"jsonrpc":"2.0","id":8,"method":"x","params":{"t":' + b"[" * DEEP + b"}}", 8),
        (b'{"jsonrpc":"2.0","method":"x","id":9,"params":{"t":"\xed\xa0\x80"}}', 9),
        (b'{"jsonrpc":"2.0","params":{"t":"\xff"},"id":10,"method":"x"}', None),
        (b'{"jsonrpc":"2.0","id":11,"result":{"t":"\xff"}}', None),
    ],
)
@LENGTHS
async def test_an_invalid_client_line_is_answered_with_the_id_it_named_first(
    line: bytes, request_id: Any, long: bool
) -> None:
    if long:
        line = line.replace(b'"x"', b'"x","pad":"' + b"p" * (STREAM_AFTER + 1000) + b'"')
    with trio.fail_after(20):
        async with bridge_over_memory() as (client, _agent):
            await send_in_pieces(client, line + b"\n")
            error = json.loads(await read_line(client))
            assert (error["id"], error["error"]["code"]) == (request_id, jsonrpc.PARSE_ERROR)
            await client.send({"jsonrpc": "2.0", "id": 2, "method": "_test/echo", "params": {}})
            assert json.loads(await read_line(client))["id"] == 2


async def test_an_invalid_agent_answer_is_dropped_and_the_client_told() -> None:
    with trio.fail_after(20):
        async with bridge_over_memory() as (client, agent):
            await client.send({"jsonrpc": "2.0", "id": 31, "method": "_test/hold"})
            await trio.testing.wait_all_tasks_blocked()
            await agent.send_raw(b'{"jsonrpc":"2.0","id":31,"result":{"t":"\xff"}}')
            error = json.loads(await read_line(client))
            assert (error["id"], error["error"]["code"]) == (31, jsonrpc.INTERNAL_ERROR)
