"""Any valid JSON is survivable (spec §2): lone surrogates, deep nesting, huge numbers.

JSON allows any ``\\uXXXX`` escape, so a peer may send text that has no UTF-8 form. Whatever
the bridge serialises itself (changed frames, answers, traces) must still be written, and
a system prompt holding such text is refused with ``-32602``, never a crash or ``-32603``.
A value the bridge could not write back as JSON is refused when it is parsed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from conftest import BridgeLines, OpenMemoryBridge

from acp_bridge.core.system_prompt import PromptRejected, parse_system_prompt
from acp_bridge.runtime.trace import Tracer
from acp_bridge.wire import jsonrpc

LONE: str = "\ud800"
LONE_ESCAPED: bytes = b'"\\ud800"'


def test_encode_writes_a_lone_surrogate_as_its_escape() -> None:
    raw = jsonrpc.encode({"jsonrpc": "2.0", "id": 1, "result": {"text": "a" + LONE}})
    assert b"\\ud800" in raw
    assert json.loads(raw)["result"]["text"] == "a" + LONE


def test_encode_keeps_other_text_readable_utf8() -> None:
    assert jsonrpc.encode({"t": "é🦜"}) == '{"t":"é🦜"}'.encode()


def test_batch_members_with_a_lone_surrogate_can_be_classified() -> None:
    frame = jsonrpc.parse(
        b'[{"jsonrpc":"2.0","id":1,"method":"x","params":{"t":' + LONE_ESCAPED + b"}}]"
    )
    (member,) = frame.members()
    assert member.params == {"t": LONE}


def test_trace_records_a_frame_holding_a_lone_surrogate(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    tracer = Tracer(path)
    raw = b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"t":' + LONE_ESCAPED + b"}}"
    tracer.record("client->bridge", raw, jsonrpc.parse(raw).message)
    tracer.record("client->bridge", raw, None)
    tracer.close()
    entries = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert [e["frame"]["params"]["t"] for e in entries] == [LONE, LONE]


@pytest.mark.parametrize("where", ["text", "second-block"])
def test_prompt_with_a_lone_surrogate_is_refused_naming_the_block(where: str) -> None:
    blocks = [{"type": "text", "text": "x" + LONE}]
    if where == "second-block":
        blocks.insert(0, {"type": "text", "text": "fine"})
    with pytest.raises(PromptRejected) as caught:
        parse_system_prompt({"mode": "append", "content": blocks}, override_allowed=False)
    assert caught.value.field == f"systemPrompt.content[{len(blocks) - 1}].text"
    assert caught.value.code == jsonrpc.INVALID_PARAMS


async def still_serving(bridge: BridgeLines, request_id: object = "alive") -> None:
    await bridge.request(request_id, "_test/echo", {"still": "here"})
    assert (await bridge.response_to(request_id))["result"] == {"still": "here"}


async def test_client_reusing_an_id_in_flight_with_a_lone_surrogate(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    # The second request's id is translated, so the bridge re-serialises that frame.
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request(1, "_test/hold", {})
            await bridge.send_line(
                b'{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{"t":'
                + LONE_ESCAPED
                + b"}}"
            )
            answer = await bridge.response_to(1)
            assert answer["result"] == {"t": LONE}
            await bridge.request(2, "_test/release", {})
            await bridge.response_to(2)
            await still_serving(bridge)


async def test_trace_on_survives_a_lone_surrogate(
    open_memory_bridge: OpenMemoryBridge, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    with trio.fail_after(30):
        async with open_memory_bridge(bridge_args=["--trace", str(trace)]) as bridge:
            await bridge.send_line(
                b'{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{"t":'
                + LONE_ESCAPED
                + b"}}"
            )
            assert (await bridge.response_to(1))["result"] == {"t": LONE}
            await still_serving(bridge)
    assert any(b"\\ud800" in line for line in trace.read_bytes().splitlines())


async def test_session_prompt_with_a_lone_surrogate_is_refused_with_invalid_params(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            await bridge.response_to(0)
            await bridge.send_line(
                b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[],'
                b'"systemPrompt":{"mode":"append","content":[{"type":"text","text":'
                + LONE_ESCAPED
                + b"}]}}}"
            )
            error = (await bridge.response_to(1))["error"]
            assert error["code"] == jsonrpc.INVALID_PARAMS
            assert error["data"] == {"field": "systemPrompt.content[0].text"}
            await still_serving(bridge)


def nested(depth: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":1,"method":"x","params":' + b"[" * depth + b"]" * depth + b"}"


def deepest_accepted() -> int:
    depth = 1
    while True:
        try:
            jsonrpc.parse(nested(depth * 2))
        except jsonrpc.FrameError:
            break
        depth *= 2
    low, high = depth, depth * 2  # low parses, high does not
    while high - low > 1:
        middle = (low + high) // 2
        try:
            jsonrpc.parse(nested(middle))
            low = middle
        except jsonrpc.FrameError:
            high = middle
    return low


def test_a_message_nested_as_deep_as_parse_allows_can_be_encoded_from_a_deeper_stack() -> None:
    frame = jsonrpc.parse(nested(deepest_accepted()))

    def encode_at(depth: int) -> bytes:
        return encode_at(depth - 1) if depth else jsonrpc.encode({**frame.message, "id": 2})

    raw = encode_at(100)
    assert jsonrpc.parse(raw).message["params"] == frame.message["params"]


@pytest.mark.parametrize(
    ("number", "written"),
    [(b"1e400", b"1e999"), (b"-1e400", b"-1e999"), (b"1" + b"0" * 400 + b".5", b"1e999")],
)
def test_a_number_out_of_float_range_is_written_back_as_json(number: bytes, written: bytes) -> None:
    frame = jsonrpc.parse(b'{"jsonrpc":"2.0","id":1,"method":"x","params":[' + number + b"]}")
    raw = jsonrpc.encode({**frame.message, "id": 2})
    assert raw == b'{"jsonrpc":"2.0","id":2,"method":"x","params":[' + written + b"]}"


def test_encode_never_writes_nan() -> None:
    with pytest.raises(ValueError):
        jsonrpc.encode({"x": float("nan")})


def test_an_out_of_range_number_nested_as_deep_as_parse_allows_can_be_encoded() -> None:
    depth = deepest_accepted() - 2
    frame = jsonrpc.parse(nested(depth).replace(b"[]", b"[1e400]"))

    def encode_at(level: int) -> bytes:
        return encode_at(level - 1) if level else jsonrpc.encode({**frame.message, "id": 2})

    assert b"[1e999]" in encode_at(100)


def test_trace_records_a_line_nested_too_deep_to_parse(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    tracer = Tracer(path)
    tracer.record("client->bridge", b"[" * 50_000, None)
    tracer.close()
    (entry,) = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert entry["raw"] == "[" * 50_000


def test_prompt_with_a_lone_surrogate_outside_its_text_is_kept_and_can_be_written() -> None:
    value = {
        "mode": "append",
        "content": [{"type": "text", "text": "a", "annotations": {"k": LONE}}],
        "_meta": {LONE: 1},
    }
    prompt = parse_system_prompt(value, override_allowed=False)
    assert prompt is not None
    wire = prompt.to_wire()
    assert wire == value
    assert json.loads(jsonrpc.encode(wire)) == value


async def test_agent_reusing_its_own_request_id_with_a_lone_surrogate(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    # The second agent request reuses an id still in flight, so the bridge renames it and
    # re-serialises the frame.
    ask = {"id": "dup", "method": "_client/ask", "params": {"t": LONE}}
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request(1, "_test/ask_client", ask)
            await bridge.request(2, "_test/ask_client", ask)
            asked = await bridge.receive_until(lambda m: m.get("method") == "_client/ask")
            asked += await bridge.receive_until(lambda m: m.get("method") == "_client/ask")
            requests = [m for m in asked if m.get("method") == "_client/ask"]
            assert [m["params"] for m in requests] == [{"t": LONE}, {"t": LONE}]
            assert requests[0]["id"] == "dup" and requests[1]["id"] != "dup"
            await still_serving(bridge)
