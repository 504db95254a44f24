"""Long lines pass through as they arrive, and are still judged before their end goes out.

The splitter offers a long line's start; the router decides whether it may go on unchanged;
the runtime writes it piece by piece (spec §2 with bounded memory). In memory: the agent is
a coroutine (tests/memory_agent.py), which drops lines it cannot parse as the ACP SDKs do.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from test_runtime import bridge_over_memory

from acp_bridge.core.long_lines import LongLines
from acp_bridge.core.pending import ForWaiter
from acp_bridge.core.router import CLIENT, PRIMARY, Router
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import DEFAULT_STREAM_AFTER as STREAM_AFTER
from acp_bridge.wire.framing import (
    Line,
    LineSplitter,
    LongLineEnd,
    LongLinePart,
    LongLineStart,
    OverlongLine,
)
from acp_bridge.wire.json_stream import CUT_METHOD, LineValidator

MiB = 1024 * 1024


# ------------------------------------------------------------------ the splitter


def test_a_long_line_is_offered_then_passed_in_pieces() -> None:
    splitter = LineSplitter(limit=1000, stream_after=10)
    assert splitter.feed(b'{"a":"12345') == [LongLineStart(b'{"a":"12345')]
    assert splitter.feed(b"678\r") == [LongLinePart(b"678")]  # the \r may be a terminator
    assert splitter.feed(b'9"}\r\n{"b":1}\n') == [
        LongLineEnd(b'\r9"}'),
        *splitter_lines(b'{"b":1}'),
    ]


def splitter_lines(*lines: bytes) -> list[Any]:
    return [Line(line) for line in lines]


def test_a_carriage_return_before_the_newline_is_the_terminator() -> None:
    splitter = LineSplitter(limit=1000, stream_after=4)
    assert splitter.feed(b"abcdef\r") == [LongLineStart(b"abcdef")]
    assert splitter.feed(b"\nxy\n") == [LongLineEnd(b""), *splitter_lines(b"xy")]


def test_a_held_line_is_gathered_whole() -> None:
    splitter = LineSplitter(limit=1000, stream_after=4)
    (start,) = splitter.feed(b"abcdef")
    assert isinstance(start, LongLineStart)
    splitter.hold(start.data)
    assert splitter.feed(b"gh") == []
    assert splitter.feed(b"ij\nkl\n") == splitter_lines(b"abcdefghij", b"kl")
    # The next long line is offered again.
    assert splitter.feed(b"mnopqr") == [LongLineStart(b"mnopqr")]


def test_the_rest_of_a_cut_line_is_dropped_without_a_report() -> None:
    splitter = LineSplitter(limit=1000, stream_after=4)
    splitter.feed(b"abcdef")
    splitter.discard_rest()
    assert splitter.feed(b"ghij") == []
    assert splitter.feed(b"kl\nmn\n") == splitter_lines(b"mn")


def test_a_passed_line_over_the_limit_is_reported_at_its_end() -> None:
    splitter = LineSplitter(limit=20, stream_after=4)
    splitter.feed(b"abcdefgh")
    assert splitter.feed(b"i" * 10) == [LongLinePart(b"i" * 10)]
    assert splitter.feed(b"j" * 10) == []
    assert splitter.feed(b"k\nok\n") == [OverlongLine(29), *splitter_lines(b"ok")]


def test_end_of_stream_ends_a_passed_line() -> None:
    splitter = LineSplitter(limit=100, stream_after=4)
    splitter.feed(b"abcdef")
    assert splitter.close() == [LongLineEnd(b"")]


# --------------------------------------------------------------------- the router


def envelope_of(prefix: bytes) -> Any:
    validator = LineValidator()
    validator.feed(prefix)
    return validator.envelope


def sinkless() -> tuple[Router, list[tuple[int, bytes]]]:
    return Router(), []


@pytest.mark.parametrize(
    ("prefix", "streams"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"fs/write","params":{"c":"xx', True),
        (b'{"jsonrpc":"2.0","method":"note","params":{"c":"xx', True),
        (b'{"jsonrpc":"2.0","id":1,"result":{"c":"xx', True),
        (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"c":"xx', False),
        (b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"c":"xx', False),
        (b'{"jsonrpc":"2.0","id":1,"method":"authenticate","params":{"c":"xx', False),
        (b'{"jsonrpc":"2.0","params":{"c":"xx', False),  # method unknown yet
        (b'{"jsonrpc":"2.0","id":[1],"method":"x","params":{"c":"xx', False),
        (b'[{"jsonrpc":"2.0","method":"x","params":{"c":"xx', False),  # a batch
        (b'{"jsonrpc":"2.0","id":1,"method":"x","_meta":{"c":"xx', False),
    ],
)
def test_which_client_lines_may_pass_as_they_come(prefix: bytes, streams: bool) -> None:
    router, _ = sinkless()
    assert (LongLines(router).receiver(CLIENT, envelope_of(prefix)) == PRIMARY) is streams


def test_no_client_line_passes_early_while_the_gate_holds_or_an_id_would_change() -> None:
    prefix = b'{"jsonrpc":"2.0","id":"acp-bridge-1","method":"x","params":{"c":"xx'
    router, _ = sinkless()
    router.request(PRIMARY, "own/request", {})  # in flight as acp-bridge-1
    assert LongLines(router).receiver(CLIENT, envelope_of(prefix)) is None
    router, _ = sinkless()
    router.hops.add()  # two processes: where it goes depends on its params
    assert LongLines(router).receiver(CLIENT, envelope_of(prefix)) is None
    router, _ = sinkless()
    router.receive_from_client(
        jsonrpc.parse(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}')
    )
    assert router.gate.active
    assert LongLines(router).receiver(CLIENT, envelope_of(prefix)) is None


def test_an_answer_the_bridge_waits_for_is_never_passed_early() -> None:
    router, _ = sinkless()
    router.request(PRIMARY, "own/request", {})
    assert isinstance(router.hops[PRIMARY].pending.get("acp-bridge-1"), ForWaiter)
    prefix = b'{"jsonrpc":"2.0","id":"acp-bridge-1","result":{"c":"xx'
    assert LongLines(router).receiver(PRIMARY, envelope_of(prefix)) is None


def test_a_cut_line_is_ended_as_json_and_its_sender_hears_why_without_any_io() -> None:
    # The whole fate of a cut client line, decided in the core: what went out, what ends
    # it, and the error the client gets under the request's id.
    router = Router()
    long_lines = LongLines(router)
    start = b'{"jsonrpc":"2.0","id":4,"method":"x/y","params":{"c":"ab'
    line = long_lines.start(CLIENT, start)
    assert line is not None and line.receiver == PRIMARY
    released = line.take(start) + long_lines.piece(line, b"cd")
    with pytest.raises(jsonrpc.FrameError) as fault:
        long_lines.piece(line, b"\x01")  # a control character inside a string
    ending = long_lines.cut(line, fault.value)
    assert ending is not None
    cut = json.loads(released + ending)
    assert (cut["id"], cut["method"], cut["params"]) == (4, CUT_METHOD, {})
    ((peer, raw),) = [(send.peer, send.raw) for send in router.data_to_send()]
    answer = json.loads(raw)
    assert peer == CLIENT and answer["id"] == 4
    assert answer["error"]["code"] == fault.value.code


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":7,"method":5}',
        b'{"jsonrpc":"2.0","id":"a","method":"m","params":3}',
        b'{"jsonrpc":"2.0","id":[1],"method":"m"}',
        b'{"jsonrpc":"2.0","id":8,"result":1,"error":{"code":1,"message":"m"}}',
        b'{"jsonrpc":"2.0","id":9,"method":"m","params":' + b"7" * 5000 + b"}",
        b"[]",
        b"42",
    ],
)
def test_a_client_line_json_read_whole_is_answered_without_judging_it_again(
    raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # json's decoder has read the line whole: it is valid JSON, and the error names the
    # request's id where the line has one. A second walk by the validator (a Python step
    # per token) only repeated that: the relay fuzz sends thousands of such lines.
    from acp_bridge.wire import json_stream

    with pytest.raises(jsonrpc.FrameError) as refused:
        jsonrpc.parse(raw)
    error = refused.value
    assert error.code != jsonrpc.PARSE_ERROR
    judged: list[bytes] = []
    judge = json_stream.judge

    def counted(line: bytes) -> tuple[json_stream.Envelope, jsonrpc.FrameError | None]:
        judged.append(line)
        return judge(line)

    monkeypatch.setattr(json_stream, "judge", counted)
    router = Router()
    assert LongLines(router).unparsed(CLIENT, raw, error, tried_whole=False) is None
    ((peer, sent),) = [(send.peer, send.raw) for send in router.data_to_send()]
    answer = json.loads(sent)
    assert peer == CLIENT
    assert answer["id"] == error.request_id
    assert answer["error"] == {"code": error.code, "message": error.message}
    assert judged == []


def test_a_streamed_request_is_recorded_at_its_end_and_its_answer_goes_back() -> None:
    router, sent = sinkless()
    line = b'{"jsonrpc":"2.0","method":"x","params":{"c":"' + b"y" * 100 + b'"},"id":9}'
    validator = LineValidator()
    validator.feed(line[:40])
    assert LongLines(router).receiver(CLIENT, validator.envelope) == PRIMARY
    validator.feed(line[40:])
    assert LongLines(router).record(CLIENT, PRIMARY, validator.finish())
    sent.extend((send.peer, send.raw) for send in router.data_to_send())
    assert sent == []  # the runtime writes the bytes; the router only records the request
    router.receive_from_agent(PRIMARY, jsonrpc.parse(b'{"jsonrpc":"2.0","id":9,"result":{}}'))
    sent.extend((send.peer, send.raw) for send in router.data_to_send())
    assert sent == [(-1, b'{"jsonrpc":"2.0","id":9,"result":{}}')]


# ---------------------------------------------------------------- the runtime


def request_line(request_id: Any, method: str, text: str, *, tail: bytes = b"") -> bytes:
    head = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method}).encode()[:-1]
    return head + b',"params":{"blob":' + json.dumps(text).encode() + b"}" + tail + b"}"


async def send_in_pieces(wire: Any, data: bytes, piece: int = 64 * 1024) -> None:
    """Write as a pipe would deliver it: the bridge reads each piece before the next."""
    for start in range(0, len(data), piece):
        await wire.send_stream.send_all(data[start : start + piece])
        await trio.testing.wait_all_tasks_blocked()


async def read_line(wire: Any) -> bytes:
    with trio.fail_after(10):
        while b"\n" not in wire.buffer:
            wire.buffer += await wire.receive_stream.receive_some(1 << 20)
    line, wire.buffer = wire.buffer.split(b"\n", 1)
    return bytes(line)


async def test_a_long_request_reaches_the_agent_before_its_end_was_sent() -> None:
    text = "é" * (2 * MiB)
    line = request_line(7, "_test/echo", text)
    async with bridge_over_memory() as (client, agent):
        cut = len(line) - 1000
        await client.send_stream.send_all(line[:cut])
        with trio.fail_after(5):
            while agent.bytes_received < STREAM_AFTER:
                await trio.sleep(0.01)
        before = agent.bytes_received
        await client.send_stream.send_all(line[cut:] + b"\n")
        answer = await read_line(client)
        assert before > STREAM_AFTER  # passed on while the client had not finished it
        assert agent.received_raw[-1] == line  # byte for byte
        assert json.loads(answer) == {"jsonrpc": "2.0", "id": 7, "result": {"blob": text}}


async def test_a_long_line_that_breaks_midway_is_cut_and_answered() -> None:
    line = request_line(8, "_test/echo", "x" * MiB)
    broken = line[: 600 * 1024] + b"\x01" + line[600 * 1024 :]
    async with bridge_over_memory() as (client, agent):
        await send_in_pieces(client, broken + b"\n")
        error = json.loads(await read_line(client))
        assert error["id"] == 8
        assert error["error"]["code"] == jsonrpc.PARSE_ERROR
        # The agent got the start, ended as the cut-line method (which it refuses; its
        # answer matches no request and is dropped); the bridge serves on.
        await client.send({"jsonrpc": "2.0", "id": 9, "method": "_test/echo", "params": {"n": 1}})
        assert json.loads(await read_line(client))["id"] == 9
        assert agent.unparsed == []
        assert_cut(agent.received_raw[-2], broken)
        assert [m.get("method") for m in agent.received[-2:]] == [CUT_METHOD, "_test/echo"]


async def test_a_long_line_over_the_limit_is_cut_and_answered() -> None:
    line = request_line(3, "_test/echo", "z" * (2 * MiB))
    async with bridge_over_memory(line_limit=MiB) as (client, agent):
        await send_in_pieces(client, line + b"\n")
        error = json.loads(await read_line(client))
        assert (error["id"], error["error"]["code"]) == (3, jsonrpc.INVALID_REQUEST)
        await client.send({"jsonrpc": "2.0", "id": 4, "method": "_test/echo", "params": {}})
        assert json.loads(await read_line(client))["id"] == 4
        assert agent.unparsed == []
        assert_cut(agent.received_raw[-2], line)


async def test_an_id_after_the_large_member_still_routes_the_answer() -> None:
    line = request_line(None, "_test/echo", "q" * MiB).replace(b'"id": null, ', b"")
    line = line[:-1] + b',"id":"late"}'
    async with bridge_over_memory() as (client, _agent):
        await send_in_pieces(client, line + b"\n")
        answer = json.loads(await read_line(client))
        assert answer["id"] == "late"
        assert len(answer["result"]["blob"]) == MiB


async def test_frames_around_a_long_line_keep_their_order() -> None:
    async with bridge_over_memory() as (client, agent):
        note = {"jsonrpc": "2.0", "method": "_test/note", "params": {}}
        await send_in_pieces(
            client,
            json.dumps({**note, "params": {"n": 1}}).encode()
            + b"\n"
            + request_line(5, "_test/echo", "w" * MiB)
            + b"\n"
            + json.dumps({**note, "params": {"n": 2}}).encode()
            + b"\n",
        )
        assert json.loads(await read_line(client))["id"] == 5
        await client.send({"jsonrpc": "2.0", "id": 6, "method": "_test/echo", "params": {}})
        assert json.loads(await read_line(client))["id"] == 6
        order = [m.get("params", {}).get("n", m.get("id")) for m in agent.received[-4:]]
        assert order == [1, 5, 2, 6]


async def test_an_agent_line_that_breaks_midway_never_reaches_the_client_whole() -> None:
    async with bridge_over_memory() as (client, agent):
        good = json.dumps(
            {"jsonrpc": "2.0", "method": "session/update", "params": {"t": "a" * MiB}}
        )
        bad = good[: 700 * 1024] + "\x02" + good[700 * 1024 :]
        data = bad.encode() + b"\n" + good.encode() + b"\n"
        for start in range(0, len(data), 64 * 1024):
            await agent.send_bytes(data[start : start + 64 * 1024])
            await trio.testing.wait_all_tasks_blocked()
        first = await read_line(client)
        assert_cut(first, bad.encode())
        assert await read_line(client) == good.encode()


async def test_an_intercepted_method_is_still_gathered_whole() -> None:
    async with bridge_over_memory() as (client, agent):
        padding = "p" * MiB
        await client.send(
            {"jsonrpc": "2.0", "id": 11, "method": "session/new",
             "params": {"cwd": "/", "mcpServers": [], "_meta": {"padding": padding},
                        "systemPrompt": {"mode": "append",
                                         "content": [{"type": "text", "text": "Be brief."}]}}}
        )  # fmt: skip
        answer = json.loads(await read_line(client))
        assert answer["result"]["sessionId"].startswith("sess-")
        (forwarded,) = [m for m in agent.received if m.get("method") == "session/new"]
        assert forwarded["params"]["_meta"]["padding"] == padding


async def test_a_client_whose_answer_was_cut_is_told() -> None:
    async with bridge_over_memory() as (client, agent):
        await client.send({"jsonrpc": "2.0", "id": 21, "method": "_test/hold", "params": {}})
        await trio.testing.wait_all_tasks_blocked()
        answer = json.dumps({"jsonrpc": "2.0", "id": 21, "result": {"t": "a" * MiB}}).encode()
        broken = answer[: 600 * 1024] + b"\x03" + answer[600 * 1024 :] + b"\n"
        for start in range(0, len(broken), 64 * 1024):
            await agent.send_bytes(broken[start : start + 64 * 1024])
            await trio.testing.wait_all_tasks_blocked()
        cut = await read_line(client)
        assert_cut(cut, broken)
        error = json.loads(await read_line(client))
        assert (error["id"], error["error"]["code"]) == (21, jsonrpc.INTERNAL_ERROR)


LONG_INVALID_ANSWERS = {
    # JSON-RPC 2.0 forbids a result and an error at once, whichever comes first or is long.
    "long-result-then-error": b'"result":{"t":"%s"},"error":{"code":1,"message":"x"}',
    "error-then-long-result": b'"error":{"code":1,"message":"x"},"result":{"t":"%s"}',
    "long-error-then-result": b'"error":{"code":1,"message":"x","data":"%s"},"result":null',
    # An error object's code and message, read after its long data.
    "code-a-string": b'"error":{"data":"%s","code":"1","message":"x"}',
    "code-a-float": b'"error":{"data":{"t":"%s"},"message":"x","code":1.5}',
    "message-missing": b'"error":{"code":-32000,"data":["%s"]}',
    "message-not-a-string": b'"error":{"message":"x","data":"%s","message":null,"code":2}',
    "error-an-array": b'"error":["%s"]',
}
VALID_LONG_ERRORS = [
    b'"error":{"data":"%s","code":-32000,"message":"x"}',
    b'"error":{"code":1,"message":"x","data":{"t":["%s"]}}',
    b'"error":{"code":7,"message":"%s"}',
    b'"error":{"code":"no","message":2,"data":"%s","code":3,"message":"x"}',
]


async def agent_writes(agent: Any, data: bytes, *, one_read: bool) -> None:
    """The agent writes ``data`` at once, or as a pipe delivers it in 64 KiB reads."""
    piece = len(data) if one_read else 64 * 1024
    for start in range(0, len(data), piece):
        await agent.send_bytes(data[start : start + piece])
        await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize("one_read", [False, True], ids=["in-pieces", "one-read"])
@pytest.mark.parametrize("members", LONG_INVALID_ANSWERS.values(), ids=LONG_INVALID_ANSWERS.keys())
async def test_a_long_answer_json_rpc_forbids_never_reaches_the_client_whose_request_is_told(
    members: bytes, one_read: bool
) -> None:
    async with bridge_over_memory() as (client, agent):
        await client.send({"jsonrpc": "2.0", "id": 21, "method": "_test/hold", "params": {}})
        await trio.testing.wait_all_tasks_blocked()
        answer = b'{"jsonrpc":"2.0","id":21,' + members % (b"a" * MiB) + b"}"
        await agent_writes(agent, answer + b"\n", one_read=one_read)
        await client.send({"jsonrpc": "2.0", "id": 22, "method": "_test/echo", "params": {}})
        lines = [await read_line(client)]
        while b'"id":22' not in lines[-1]:
            lines.append(await read_line(client))
    for line in lines:
        assert line != answer
        frame = jsonrpc.parse(line)  # valid JSON-RPC, whatever it is
        if frame.kind is jsonrpc.Kind.RESPONSE and frame.id is None:
            assert_cut(line, answer)  # a start passed on, ended as an answer to nothing
    errors = [m["error"]["code"] for m in map(json.loads, lines) if m.get("id") == 21]
    assert errors == [jsonrpc.INTERNAL_ERROR]


@pytest.mark.parametrize("one_read", [False, True], ids=["in-pieces", "one-read"])
@pytest.mark.parametrize("members", VALID_LONG_ERRORS)
async def test_a_long_error_answer_passes_byte_for_byte(members: bytes, one_read: bool) -> None:
    async with bridge_over_memory() as (client, agent):
        await client.send({"jsonrpc": "2.0", "id": 23, "method": "_test/hold", "params": {}})
        await trio.testing.wait_all_tasks_blocked()
        answer = b'{"jsonrpc":"2.0","id":23,' + members % (b"e" * MiB) + b"}"
        await agent_writes(agent, answer + b"\n", one_read=one_read)
        assert await read_line(client) == answer


# What a cut line surely passed on: its first STREAM_AFTER bytes but for an escape or a
# character the first read cut, which waited to be judged.
SURE_START = STREAM_AFTER - 8


def assert_cut(received: bytes, sent: bytes) -> None:
    """``received`` is a long start of ``sent``, ended as a message a JSON reader takes
    for the cut-line notification or an answer to no request (the last of two members of
    one name wins): valid JSON-RPC, never a line its receiver cannot parse."""
    frame = jsonrpc.parse(received)
    if frame.method is not None:
        assert (frame.method, frame.params) == (CUT_METHOD, {})
    else:
        assert frame.kind is jsonrpc.Kind.RESPONSE and frame.id is None
    common = common_start(received, sent)
    assert common >= SURE_START and len(received) - common < 128


def common_start(a: bytes, b: bytes) -> int:
    """How many bytes ``a`` and ``b`` start with alike: a search by halves comparing
    slices, where a walk byte by byte in Python took most of this file's CPU."""
    alike, unlike = 0, min(len(a), len(b)) + 1  # a[:alike] == b[:alike]; not so at unlike
    while unlike - alike > 1:
        middle = (alike + unlike) // 2
        if a[:middle] == b[:middle]:
            alike = middle
        else:
            unlike = middle
    return alike


# ------------------------------------------------------------------------ fuzz

LONG_SEED = 20261202


def long_line(rng: random.Random, request_id: Any | None, method: str) -> bytes:
    """A long message: a big string among other members, in a random order of keys."""
    size = rng.choice([300 * 1024, 700 * 1024, 1536 * 1024])  # the last is over the limit
    blob = json.dumps(rng.choice(["x", "é", "\\\\", "\\u00e9", "😀"]) * (size // 4))
    members = [b'"jsonrpc":"2.0"', b'"method":' + json.dumps(method).encode()]
    if request_id is not None:
        members.append(b'"id":' + json.dumps(request_id).encode())
    rng.shuffle(members)
    params = b'"params":{"sessionId":"s","blob":' + blob.encode() + b"}"
    members.insert(rng.randrange(len(members) + 1), params)
    return b"{" + b",".join(members) + b"}"


def mutate(rng: random.Random, line: bytes) -> bytes:
    at = rng.randrange(len(line))
    return line[:at] + rng.choice([b"\x01", b"\xff", b'"', b"}", b"\\q"]) + line[at:]


def is_valid(line: bytes) -> bool:
    try:
        jsonrpc.parse_in_full(line)
    except jsonrpc.FrameError:
        return False
    return True


async def send_pieces(send: Any, data: bytes, rng: random.Random) -> None:
    start = 0
    while start < len(data):
        size = rng.choice([4096, 65536, 200 * 1024, 1 << 20])
        await send(data[start : start + size])
        await trio.testing.wait_all_tasks_blocked()
        start += size


@dataclass
class Sent:
    """What one side sent: lines the bridge must pass whole, and lines it may cut."""

    valid: list[bytes] = field(default_factory=list)
    broken: list[bytes] = field(default_factory=list)

    def add(self, line: bytes) -> None:
        (self.valid if is_valid(line) and len(line) <= MiB else self.broken).append(line)

    def check_received(self, lines: list[bytes]) -> None:
        """Every valid line arrived byte for byte; of a broken one at most its start,
        ended as a cut line."""
        for line in lines:
            if line not in self.valid:
                assert_cut_of_one(line, self.broken)
        assert all(line in lines for line in self.valid)
        assert self.broken, "the seed must produce broken lines"


def assert_cut_of_one(line: bytes, sent: list[bytes]) -> None:
    """``line`` is a cut of one of ``sent`` (see :func:`assert_cut`)."""
    for candidate in sent:
        if candidate[:SURE_START] == line[:SURE_START]:
            try:
                assert_cut(line, candidate)
            except AssertionError:
                continue
            return
    raise AssertionError(f"not a cut of a line sent: {line[:80]!r}")


async def test_long_lines_from_both_sides_keep_every_promise() -> None:
    # The agent's lines go through a real pipe, read as a process's are (pipes.read_now).
    rng = random.Random(LONG_SEED)
    from_client, from_agent = Sent(), Sent()
    requests: set[Any] = set()
    received: list[bytes] = []
    async with bridge_over_memory(line_limit=MiB, agent_options={"piped_output": True}) as (
        client,
        agent,
    ):
        first = len(agent.received_raw)

        async def read_client() -> None:
            while True:
                received.append(await read_line(client))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_client)
            for index in range(60):
                request_id = index if rng.random() < 0.6 else None
                line = long_line(rng, request_id, rng.choice(["_test/echo", "x/unknown"]))
                line = mutate(rng, line) if rng.random() < 0.3 else line
                from_client.add(line)
                requests.update([request_id] if request_id is not None else [])
                await send_pieces(client.send_stream.send_all, line + b"\n", rng)
                if index % 3 == 0:
                    update = long_line(rng, None, "session/update")
                    update = mutate(rng, update) if rng.random() < 0.4 else update
                    from_agent.add(update)
                    await send_pieces(agent.send_bytes, update + b"\n", rng)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        from_client.check_received(agent.received_raw[first:])

    answers = [json.loads(line) for line in received if is_valid(line)]
    updates = [line for line in received if line in from_agent.valid]
    assert all(line in from_agent.valid for line in updates)
    assert all(line in updates for line in from_agent.valid)
    # Nothing but valid JSON-RPC reached the client: a broken update's start, or an echoed
    # answer cut at the line limit, arrive ended as cut lines.
    assert all(is_valid(line) for line in received)
    cut = [line for line in received if line not in from_agent.valid]
    for line in cut:
        if b'"session/update"' in line[:STREAM_AFTER]:
            assert_cut_of_one(line, from_agent.broken)
    assert from_agent.broken, "the seed must produce broken lines"
    answered = [message["id"] for message in answers if "method" not in message]
    # Every request with an id is answered exactly once: by the agent, or with the error;
    # a broken line whose id could not be read is answered with id null.
    readable = [rid for rid in answered if rid in requests]
    assert sorted(readable) == sorted(set(readable))
    assert len(requests - set(readable)) <= answered.count(None)
    whole = [json.loads(line) for line in from_client.valid]
    assert {message["id"] for message in whole if "id" in message} <= set(readable)


async def test_with_stream_after_0_every_line_is_gathered_whole() -> None:
    line = request_line(7, "_test/echo", "k" * MiB)
    async with bridge_over_memory(stream_after=0) as (client, agent):
        await send_in_pieces(client, line[:-10])
        assert agent.bytes_received < 1000  # only the initialize exchange
        await send_in_pieces(client, line[-10:] + b"\n")
        assert json.loads(await read_line(client))["id"] == 7
        assert agent.received_raw[-1] == line
