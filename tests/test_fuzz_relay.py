"""Random and mutated frames from both sides through the bridge (in memory, seeded, bounded).

What must hold whatever arrives: the bridge keeps serving; every client request with a
usable id gets exactly one answer; frames the bridge does not change arrive byte for
byte; nothing but valid JSON-RPC reaches either side.
"""

from __future__ import annotations

import json
import random
from typing import Any, Final

import trio
import trio.testing
from test_runtime import bridge_over_memory

from acp_bridge.wire import jsonrpc

SEED: Final = 20261201
CLIENT_LINES: Final = 3000
AGENT_LINES: Final = 3000

ODD_TEXT: Final = [
    "\\ud800",
    "\\udfff",
    "\\u0000",
    "é",
    "\\n",
    '\\"',
    "\\\\",
    "😀",
    "\\ud83d\\ude00",
]
METHODS: Final = [
    "x/unknown",
    "_ext/method",
    "session/set_mode",
    "session/prompt",
    "session/cancel",
    "session/new",
    "session/load",
    "$/cancel_request",
    "_test/echo",
]


def odd_string(rng: random.Random) -> str:
    """JSON string *source* text (escapes kept as escapes)."""
    return "".join(rng.choice([*ODD_TEXT, "a", "b", " "]) for _ in range(rng.randint(0, 6)))


def value(rng: random.Random, depth: int = 0) -> str:
    """Random JSON source text."""
    choice = rng.randint(0, 9 if depth < 4 else 5)
    if choice == 0:
        return str(rng.choice([0, -1, 2**64, 10**30]))
    if choice == 1:
        return rng.choice(["1e400", "-1e400", "1.5", "-0.0", "1e-400"])
    if choice == 2:
        return rng.choice(["true", "false", "null"])
    if choice in (3, 4, 5):
        return json.dumps(odd_string(rng))[0] + odd_string(rng) + '"'
    if choice in (6, 7):
        return "[" + ",".join(value(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    keys = ["sessionId", "requestId", "_meta", "systemPrompt", "x", odd_string(rng)]
    members = [f'"{rng.choice(keys)}":{value(rng, depth + 1)}' for _ in range(rng.randint(0, 3))]
    return "{" + ",".join(members) + "}"


class Ids:
    def __init__(self) -> None:
        self.counter = 0

    def fresh(self, rng: random.Random) -> tuple[str, Any]:
        """A unique id: its JSON source and its value."""
        self.counter += 1
        if rng.random() < 0.5:
            return str(self.counter), self.counter
        source = f'"{odd_string(rng)}#{self.counter}"'
        return source, json.loads(source)


def client_line(
    rng: random.Random, ids: Ids, requests: dict[Any, int], *, in_batch: bool = False
) -> bytes:
    """One random client line; the requests it holds that must get an answer are added
    to ``requests`` (a batch only when it parses as a whole)."""
    roll = rng.random()
    method = rng.choice(METHODS)
    params = value(rng) if rng.random() < 0.3 else '{"sessionId":"sess-1","x":' + value(rng) + "}"
    if roll < 0.45:
        source, request_id = ids.fresh(rng)
        if method == "session/new":
            params = (
                '{"cwd":"/","mcpServers":[],"systemPrompt":{"mode":"append","content":'
                '[{"type":"text","text":'
                + json.dumps(odd_string(rng))[0]
                + odd_string(rng)
                + '"}]}}'
            )
        line = f'{{"jsonrpc":"2.0","id":{source},"method":"{method}","params":{params}}}'
        try:
            if jsonrpc.parse(line.encode()).kind is jsonrpc.Kind.REQUEST:
                requests[request_id] = 0
        except jsonrpc.FrameError:
            pass  # refused by the bridge; the id may not be readable
        return line.encode()
    if in_batch:
        roll = 0.45 + (roll - 0.45) * 0.3  # a member is a notification or a response
    if roll < 0.65:
        return f'{{"jsonrpc":"2.0","method":"{method}","params":{params}}}'.encode()
    if roll < 0.75:
        return f'{{"jsonrpc":"2.0","id":{value(rng)},"result":{value(rng)}}}'.encode()
    if roll < 0.82:
        member_requests: dict[Any, int] = {}
        members = [
            client_line(rng, ids, member_requests, in_batch=True) for _ in range(rng.randint(1, 3))
        ]
        batch = b"[" + b",".join(members) + b"]"
        try:
            jsonrpc.parse(batch)
            requests.update(member_requests)
        except jsonrpc.FrameError:
            pass
        return batch
    if roll < 0.86:
        return b"[" * 3000 + b"]" * 3000
    if roll < 0.9:
        return rng.choice([b"{", b"nonsense", b"\xff\xfe", b"[]", b"{}", b'"\\ud800"'])
    # A valid frame with one byte changed.
    base = bytearray(f'{{"jsonrpc":"2.0","method":"{method}","params":{params}}}'.encode())
    base[rng.randrange(len(base))] = rng.randrange(256)
    return bytes(base)


def agent_line(rng: random.Random, counter: int) -> bytes:
    roll = rng.random()
    if roll < 0.4:
        return f'{{"jsonrpc":"2.0","method":"session/update","params":{value(rng)}}}'.encode()
    if roll < 0.55:
        source = f'"agent-{counter}-{odd_string(rng)}"'
        return f'{{"jsonrpc":"2.0","id":{source},"method":"fs/read","params":{{}}}}'.encode()
    if roll < 0.65:
        return f'{{"jsonrpc":"2.0","id":{value(rng)},"result":{value(rng)}}}'.encode()
    if roll < 0.75:
        return (
            f'[{{"jsonrpc":"2.0","method":"x/n","params":{value(rng)}}},'
            f'{{"jsonrpc":"2.0","id":{value(rng)},"result":null}},{value(rng)}]'
        ).encode()
    if roll < 0.85:
        return rng.choice([b"garbage", b"{", b"[]", b"\xff", b"[" * 3000 + b"]" * 3000, b"42"])
    return (
        f'{{"jsonrpc":"2.0","method":"$/cancel_request","params":{{"requestId":{value(rng)}}}}}'
    ).encode()


def answers(lines: list[bytes]) -> list[Any]:
    """The ids of the responses in ``lines``, batch members included, in order."""
    found = []
    for line in lines:
        message = json.loads(line)
        for member in message if isinstance(message, list) else [message]:
            if isinstance(member, dict) and "method" not in member and "id" in member:
                found.append(member["id"])
    return found


def answered_ids(lines: list[bytes]) -> set[Any]:
    return {answered for answered in answers(lines) if isinstance(answered, (int, str))}


def valid_jsonrpc(line: bytes) -> bool:
    try:
        frame = jsonrpc.parse(line)
    except jsonrpc.FrameError:
        return False
    members = frame.message if frame.kind is jsonrpc.Kind.BATCH else [frame.message]
    for member in members:
        try:
            jsonrpc.classify_message(member, b"")
        except jsonrpc.FrameError:
            return False
    return True


async def test_random_frames_from_both_sides_never_break_the_bridge() -> None:
    rng = random.Random(SEED)
    ids = Ids()
    requests: dict[Any, int] = {}
    untouched: list[bytes] = []
    client_received: list[bytes] = []
    with trio.fail_after(120):
        async with bridge_over_memory(adapter="first-turn") as (client, agent):

            async def read_client() -> None:
                while True:
                    while b"\n" not in client.buffer:
                        data = await client.receive_stream.receive_some(1 << 20)
                        if not data:
                            return
                        client.buffer += data
                    line, client.buffer = client.buffer.split(b"\n", 1)
                    client_received.append(line)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_client)
                for index in range(max(CLIENT_LINES, AGENT_LINES)):
                    if index < CLIENT_LINES:
                        line = client_line(rng, ids, requests)
                        unknown = line.startswith(b'{"jsonrpc":"2.0","method":"x/unknown"')
                        if unknown and valid_jsonrpc(line) and "id" not in json.loads(line):
                            untouched.append(line)
                        await client.send_stream.send_all(line + b"\n")
                    if index < AGENT_LINES:
                        await agent.send_raw(agent_line(rng, index))
                    if index % 100 == 0:
                        await trio.testing.wait_all_tasks_blocked()
                # Still serving.
                await client.send_stream.send_all(
                    b'{"jsonrpc":"2.0","id":"alive","method":"_test/echo","params":{}}\n'
                )
                with trio.fail_after(10):
                    while not any(b'"alive"' in line for line in client_received):
                        await trio.sleep(0.01)
                # Answers held behind a session's interception (a store call in a worker
                # thread, say) may still be on their way.
                with trio.move_on_after(20):
                    while set(requests) - answered_ids(client_received):
                        await trio.sleep(0.05)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()

    invalid_to_client = [line for line in client_received if not valid_jsonrpc(line)]
    invalid_to_agent = [line for line in agent.received_raw if not valid_jsonrpc(line)]
    assert invalid_to_client == []
    assert invalid_to_agent == []
    for answered in answers(client_received):
        if answered in requests:
            requests[answered] += 1
    unanswered = [rid for rid, count in requests.items() if count == 0]
    twice = [rid for rid, count in requests.items() if count > 1]
    assert (len(unanswered), len(twice)) == (0, 0), (unanswered[:5], twice[:5])
    assert untouched and all(line in agent.received_raw for line in untouched)
