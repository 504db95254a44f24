"""Each bad input has a defined outcome, and the bridge keeps serving after it.

The bridge runs in memory in front of the fake agent as a coroutine; only the shutdown
tests whose agent leaves a grandchild process start processes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from conftest import BridgeLines, OpenBridge, OpenMemoryBridge, pid_alive

INVALID_REQUEST = -32600


async def still_serving(bridge: BridgeLines, request_id: Any = "alive") -> None:
    await bridge.request(request_id, "_test/echo", {"still": "here"})
    assert (await bridge.response_to(request_id))["result"] == {"still": "here"}


def agent_received(bridge: BridgeLines) -> bytes:
    return bridge.file("agent-received").read_bytes()


@pytest.mark.parametrize(
    "line",
    [b"{", b"not json at all", b"\xff\xfe", b"[" * 50_000, b'{"jsonrpc":"2.0","method":"x"'],
    ids=["truncated", "words", "bad-utf8", "deep-nesting", "unterminated-no-id"],
)
async def test_malformed_json_gets_parse_error_with_null_id(
    open_memory_bridge: OpenMemoryBridge, line: bytes
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.send_line(line)
            error = await bridge.receive()
            assert error["id"] is None
            assert error["error"]["code"] == -32700
            await still_serving(bridge)
            assert line not in agent_received(bridge).splitlines()


async def test_malformed_json_that_named_its_id_first_is_answered_with_it(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            for line, request_id in (
                (b'{"jsonrpc":"2.0","id":1,"method":"x"', 1),
                (b'{"jsonrpc":"2.0","id":"u8","method":"x","params":{"t":"\xff"}}', "u8"),
            ):
                await bridge.send_line(line)
                error = await bridge.receive()
                assert (error["id"], error["error"]["code"]) == (request_id, -32700)
            await still_serving(bridge)


@pytest.mark.parametrize("line", [b"42", b'"a string"', b"[]", b"null", b"true"])
async def test_non_object_gets_invalid_request_with_null_id(
    open_memory_bridge: OpenMemoryBridge, line: bytes
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.send_line(line)
            error = await bridge.receive()
            assert error == {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": INVALID_REQUEST, "message": error["error"]["message"]},
            }
            await still_serving(bridge)
            assert agent_received(bridge).count(b"\n") == 1


@pytest.mark.parametrize("bad_id", ["{}", "[1]", "true", "1.5"])
async def test_invalid_id_types_get_invalid_request_with_null_id(
    open_memory_bridge: OpenMemoryBridge, bad_id: str
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.send_line(
                b'{"jsonrpc":"2.0","id":%s,"method":"_test/echo"}' % bad_id.encode()
            )
            error = await bridge.receive()
            assert error["id"] is None and error["error"]["code"] == INVALID_REQUEST
            await still_serving(bridge)


async def test_invalid_shape_with_readable_id_is_answered_with_that_id(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.send_line(b'{"jsonrpc":"2.0","id":"mine","method":7}')
            error = await bridge.receive()
            assert error["id"] == "mine" and error["error"]["code"] == INVALID_REQUEST
            await still_serving(bridge)


async def test_overlong_client_line_gets_invalid_request_and_bridge_keeps_serving(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    limit = 1000
    with trio.fail_after(30):
        async with open_memory_bridge(config={"line_limit": limit}) as bridge:
            long_line = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": "long",
                    "method": "_test/echo",
                    "params": {"x": "y" * 5000},
                }
            ).encode()
            await bridge.send_line(long_line)
            error = await bridge.receive()
            assert error["id"] is None
            assert error["error"]["code"] == INVALID_REQUEST
            assert str(len(long_line)) in error["error"]["message"]
            await still_serving(bridge)
            assert b'"long"' not in agent_received(bridge)


@pytest.mark.parametrize("method", [b'["x"]', b"{}"], ids=["list", "object"])
async def test_batch_member_with_a_method_that_is_not_a_string_is_refused_alone(
    open_memory_bridge: OpenMemoryBridge, method: bytes
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.send_line(
                b'[{"jsonrpc":"2.0","id":1,"method":%s},'
                b'{"jsonrpc":"2.0","id":2,"method":"_test/echo","params":{"n":2}}]' % method
            )
            first, second = await bridge.receive(), await bridge.receive()
            answers = [*(first if isinstance(first, list) else [first])]
            answers += second if isinstance(second, list) else [second]
            by_id = {answer["id"]: answer for answer in answers}
            assert by_id[1]["error"]["code"] == INVALID_REQUEST
            assert "result" in by_id[2]
            await still_serving(bridge)


async def test_unhashable_cancel_request_id_passes_through_without_harm(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            for weird in (b"{}", b"[1,2]", b"null"):
                await bridge.send_line(
                    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":%s}}'
                    % weird
                )
            await bridge.send_line(b'[{"jsonrpc":"2.0","id":{"a":1},"method":"_x/batched"}]')
            await still_serving(bridge)
            assert agent_received(bridge).count(b"$/cancel_request") == 3


async def test_garbage_from_agent_never_reaches_client(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    garbage = [
        *("not json", "{", "42", "[]", '"text"', '{"neither":"request nor response"}'),
        *('{"jsonrpc":"2.0","id":{},"method":"x"}', "[" * 50_000, "Loading model...\t"),
    ]
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request(1, "_test/emit", {"lines": garbage})
            response = await bridge.receive()
            assert response == {"jsonrpc": "2.0", "id": 1, "result": {}}
            await still_serving(bridge)
            await bridge.close_stdin()
            assert await bridge.read_to_eof() == []
            assert await bridge.wait() == 0
    received = bytes(bridge.received).splitlines()
    for line in garbage:
        assert line.encode() not in received
    assert bridge.stderr().count("dropped a line that is not JSON-RPC") == len(garbage)


async def test_unknown_methods_pass_through_both_ways(open_memory_bridge: OpenMemoryBridge) -> None:
    note = b'{"jsonrpc":"2.0","method":"_acme/notify","params":{"_meta":{"k":"v"}}}'
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.send_line(b'{"jsonrpc":"2.0","id":5,"method":"acme/unknown","params":{}}')
            assert (await bridge.response_to(5))["error"]["code"] == -32601
            await bridge.request(6, "_test/emit", {"lines": [note.decode()]})
            assert await bridge.receive_line() == note
            await still_serving(bridge)
    assert b"acme/unknown" in agent_received(bridge)


async def test_dying_agent_fails_every_pending_request_with_its_exit_status(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await still_serving(bridge, "warm-up")
            for request_id in ("a", 2, "acp-bridge-1"):
                await bridge.request(request_id, "_test/hang")
            await bridge.request("exit", "_test/exit", {"code": 3})
            lines = await bridge.read_to_eof()
            assert await bridge.wait() == 3
    errors = {json.loads(line)["id"]: json.loads(line)["error"] for line in lines}
    assert set(errors) == {"a", 2, "acp-bridge-1", "exit"}
    for error in errors.values():
        assert error["code"] == -32603
        assert "exited with status 3" in error["message"]
        assert error["data"] == {"exitStatus": 3}
    assert not any(agent.returncode is None for agent in bridge.agents)


async def test_client_closing_stdin_mid_stream_shuts_down_in_order(
    open_bridge: OpenBridge,
) -> None:
    with trio.fail_after(30):
        async with open_bridge(config={"shutdown_grace": 0.3}, grandchild=True) as bridge:
            await still_serving(bridge)
            await bridge.request("pending", "_test/hang")
            await bridge.send_bytes(b'{"jsonrpc":"2.0","method":"half a li')
            await bridge.close_stdin()
            await bridge.read_to_eof()
            await bridge.wait()
            assert len(bridge.pids()) == 2
            assert not any(pid_alive(pid) for pid in bridge.pids())


async def test_client_closing_its_read_end_shuts_down_in_order(open_bridge: OpenBridge) -> None:
    with trio.fail_after(30):
        async with open_bridge(config={"shutdown_grace": 0.3}, grandchild=True) as bridge:
            await still_serving(bridge)
            await bridge.stdout.aclose()
            # The bridge notices when it next writes to the client.
            await bridge.request("x", "_test/echo", {})
            await bridge.wait()
            assert len(bridge.pids()) == 2
            assert not any(pid_alive(pid) for pid in bridge.pids())


async def test_batch_holding_a_session_request_is_refused_whole(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request(0, "initialize", {"protocolVersion": 2})
            await bridge.response_to(0)
            batch = [
                {"jsonrpc": "2.0", "id": "a", "method": "session/new", "params": {"cwd": "/"}},
                {"jsonrpc": "2.0", "id": "b", "method": "_test/echo", "params": {}},
                {"jsonrpc": "2.0", "method": "_test/note", "params": {}},
            ]
            await bridge.send_line(json.dumps(batch).encode())
            errors = await bridge.receive()
            assert [e["id"] for e in errors] == ["a", "b"]
            assert all(e["error"]["code"] == INVALID_REQUEST for e in errors)
            assert "session/new" in errors[0]["error"]["message"]
            await still_serving(bridge)
            assert b"session/new" not in agent_received(bridge)


# Answers JSON-RPC 2.0 forbids: a result and an error at once, or an error that is not
# an object with an integer code and a string message.
INVALID_ANSWERS = {
    "result-and-error": '"result":{},"error":{"code":-32000,"message":"no"}',
    "error-and-null-result": '"result":null,"error":{"code":-32000,"message":"no"}',
    "code-a-string": '"error":{"code":"-32000","message":"no"}',
    "code-a-float": '"error":{"code":-32000.0,"message":"no"}',
    "code-a-boolean": '"error":{"code":true,"message":"no"}',
    "code-missing": '"error":{"message":"no"}',
    "message-not-a-string": '"error":{"code":-32000,"message":{"text":"no"}}',
    "message-missing": '"error":{"code":-32000}',
    "error-a-string": '"error":"no"',
    "error-null": '"error":null',
}


@pytest.mark.parametrize("members", INVALID_ANSWERS.values(), ids=INVALID_ANSWERS.keys())
async def test_an_invalid_answer_from_the_agent_is_an_error_to_its_request_not_passed_on(
    open_memory_bridge: OpenMemoryBridge, members: str
) -> None:
    line = f'{{"jsonrpc":"2.0","id":"asked",{members}}}'
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request("asked", "_test/hang", {})
            await bridge.request("emit", "_test/emit", {"lines": [line]})
            first, second = await bridge.receive(), await bridge.receive()
            answers = {first["id"]: first, second["id"]: second}
            assert answers["emit"] == {"jsonrpc": "2.0", "id": "emit", "result": {}}
            refused = answers["asked"]
            assert refused["error"]["code"] == -32603, refused
            assert "not valid JSON-RPC" in refused["error"]["message"], refused
            await still_serving(bridge)
    assert line.encode() not in bytes(bridge.received).splitlines()
    assert bridge.stderr().count("dropped a line that is not JSON-RPC") == 1


@pytest.mark.parametrize("members", INVALID_ANSWERS.values(), ids=INVALID_ANSWERS.keys())
async def test_an_invalid_answer_in_an_agent_batch_is_an_error_to_its_request(
    open_memory_bridge: OpenMemoryBridge, members: str
) -> None:
    note = '{"jsonrpc":"2.0","method":"_x/note","params":{}}'
    line = f'[{{"jsonrpc":"2.0","id":"asked",{members}}},{note}]'
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request("asked", "_test/hang", {})
            await bridge.request("emit", "_test/emit", {"lines": [line]})
            seen = [await bridge.receive() for _ in range(3)]
            batches = [message for message in seen if isinstance(message, list)]
            answers = {m["id"]: m for m in seen if isinstance(m, dict) and "id" in m}
            assert batches == [[json.loads(note)]], seen
            assert answers["emit"]["result"] == {}
            assert answers["asked"]["error"]["code"] == -32603, answers
            await still_serving(bridge)
    assert "dropped a batch member that is not JSON-RPC" in bridge.stderr()


async def test_valid_error_answers_from_the_agent_pass_byte_for_byte(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    lines = [
        '{"jsonrpc":"2.0","id":"a","error":{"code":-32000,"message":"no","data":{"x":[1]}}}',
        '{"error" : {"message":"", "code":0}, "id":"b", "jsonrpc":"2.0"}',
        '{"jsonrpc":"2.0","id":"c","error":{"code":' + "9" * 5000 + ',"message":"big"}}',
    ]
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            for request_id in ("a", "b", "c"):
                await bridge.request(request_id, "_test/hang", {})
            await bridge.request("emit", "_test/emit", {"lines": lines})
            received = [await bridge.receive_line() for _ in range(4)]
            assert received[:3] == [line.encode() for line in lines]
            await still_serving(bridge)


@pytest.mark.parametrize("members", INVALID_ANSWERS.values(), ids=INVALID_ANSWERS.keys())
async def test_an_invalid_answer_from_the_client_is_refused_and_not_passed_on(
    open_memory_bridge: OpenMemoryBridge, members: str
) -> None:
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request(1, "_test/ask_client", {"id": "perm", "method": "x/ask"})
            asked = await bridge.receive()
            assert (asked["id"], asked["method"]) == ("perm", "x/ask")
            line = b'{"jsonrpc":"2.0","id":"perm",%s}' % members.encode()
            await bridge.send_line(line)
            error = await bridge.receive()
            assert error["id"] == "perm" and error["error"]["code"] == INVALID_REQUEST, error
            await still_serving(bridge)
            assert line not in agent_received(bridge).splitlines()
            # The agent still takes a valid answer to its request.
            await bridge.send_line(b'{"jsonrpc":"2.0","id":"perm","result":{"ok":true}}')
            assert (await bridge.response_to(1))["result"]["clientSaid"]["result"] == {"ok": True}


async def test_a_dropped_answer_is_logged_by_its_fault_and_id_not_its_text(
    open_memory_bridge: OpenMemoryBridge,
) -> None:
    # What an answer carries may be the prompt (an agent echoing what it was given): the
    # log names why the line was dropped and what it answered, never its content.
    line = json.dumps(
        {"jsonrpc": "2.0", "id": "asked", "result": {"text": "Be brief, MARKER-1."},
         "error": {"code": 1, "message": "MARKER-2", "data": "MARKER-3"}}
    )  # fmt: skip
    with trio.fail_after(30):
        async with open_memory_bridge() as bridge:
            await bridge.request("asked", "_test/hang", {})
            await bridge.request("emit", "_test/emit", {"lines": [line]})
            assert (await bridge.response_to("asked"))["error"]["code"] == -32603
            await still_serving(bridge)
    stderr = bridge.stderr()
    assert "MARKER" not in stderr, stderr
    assert "dropped a line that is not JSON-RPC" in stderr
    assert "result or an error, not both" in stderr and "'asked'" in stderr, stderr
