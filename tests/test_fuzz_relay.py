"""Structure-aware mutation of JSON-RPC from both sides through the bridge (in memory, the
agent's output through a real pipe as a process's is; seeded, bounded).

Each line starts as a well-formed message of its side (requests, notifications and
answers of the methods the bridge intercepts and of others, batches of them) and is then
mutated where a peer can go wrong: any member of any message, batch members included,
gets a value of every JSON type (null, booleans, integers small and beyond int()'s 4,300
digits, floats up to 1e400, odd strings with lone surrogates, arrays, objects, nesting
deeper than Python's json builds), members are dropped, repeated or reordered, batches get
non-object and nested members, and some lines are blank, whitespace, ``\\r\\n``-ended,
cut short or have a byte changed.

What must hold whatever arrives: the bridge keeps serving; a client request with an id of
its own gets at most one answer, and exactly one when the agent could read it (or the
bridge answers it itself); frames the bridge does not change arrive byte for byte; nothing
but valid JSON-RPC reaches either side.

20,000 lines go each way, with a fixed seed, whatever the environment says: the relay is
held to at least that in every run (the other property tests draw a quarter of their
inputs unless ``ACP_BRIDGE_FULL_FUZZ=1``, :mod:`fuzz_size`). The run makes more than 300
values nested past json's recursion and more than 3,000 integers past int()'s digits (the
counts the test asserts), and finds the batch defect the fuzz was written for (with a
refused batch's malformed members that name an id left unanswered again, 34 requests go
unanswered even at 5,000 lines).
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

import trio
import trio.testing
from memory_agent import read_json
from test_runtime import bridge_over_memory

from acp_bridge.wire import json_stream, jsonrpc

SEED: Final = 20261201
CLIENT_LINES: Final = 20_000
AGENT_LINES: Final = CLIENT_LINES
LINES_PER_WRITE: Final = 40  # a pipe delivers several lines per read
STALLED: Final = 20.0  # seconds without a line to the client: the bridge stopped serving

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
    "\u2028",
]
CLIENT_METHODS: Final = [
    "x/unknown",
    "_ext/method",
    "session/set_mode",
    "session/prompt",
    "session/cancel",
    "session/new",
    "session/load",
    "session/resume",
    "session/fork",
    "session/close",
    "$/cancel_request",
    "authenticate",
    "initialize",
    "_test/echo",
]
AGENT_METHODS: Final = ["session/update", "fs/read_text_file", "session/request_permission"]
KEYS: Final = ["jsonrpc", "id", "method", "params", "result", "error"]
PARAM_KEYS: Final = ["sessionId", "requestId", "systemPrompt", "_meta", "cwd", "mcpServers", "x"]
VALUE_KEYS: Final = [*PARAM_KEYS, "type", "text", "mode", "content"]
ODD_CHARACTERS: Final = [*ODD_TEXT, "a", "b", " "]


@functools.cache
def dumped(name: str) -> str:
    """A member name or method as JSON text (from the few above: made once each)."""
    return json.dumps(name)


def odd_string(rng: random.Random) -> str:
    """JSON string *source* text (escapes kept as escapes), quotes included."""
    body = "".join(rng.choice(ODD_CHARACTERS) for _ in range(rng.randint(0, 5)))
    return f'"{body}"'


def huge_integer(rng: random.Random) -> str:
    digits = rng.randint(4_301, 6_000)
    return rng.choice(["", "-"]) + str(rng.randint(1, 9)) + "7" * (digits - 1)


def deep(rng: random.Random) -> str:
    """Nesting beyond what Python's json builds (about 1,000 levels), mostly just beyond."""
    levels = rng.choice([950, 1_100, 1_500, 3_000])
    if rng.random() < 0.5:
        return "[" * levels + "1" + "]" * levels
    return '{"d":' * levels + "null" + "}" * levels


class Values:
    """JSON source text of every type; ``deep`` and ``huge`` count the rare ones made."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.made: Counter[str] = Counter()

    def any(self, depth: int = 0) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.08:
            return rng.choice(["null", "true", "false"])
        if roll < 0.18:
            return rng.choice(["0", "-1", "7", "2", "18446744073709551616", "1" + "0" * 30])
        if roll < 0.24:
            return rng.choice(["1.5", "-0.0", "1e400", "-1e400", "1e-400", "0.1e2"])
        if roll < 0.285:
            self.made["huge numbers"] += 1
            return huge_integer(rng)
        if roll < 0.29:  # costly to judge (a few ms each): rare, but hundreds in all
            self.made["deep values"] += 1
            return deep(rng)
        if roll < 0.5:
            return odd_string(rng)
        if depth > 2 or roll < 0.7:
            return "[" + ",".join(self.any(depth + 1) for _ in range(rng.randint(0, 3))) + "]"
        members = [
            f"{dumped(rng.choice(VALUE_KEYS))}:{self.any(depth + 1)}"
            for _ in range(rng.randint(0, 3))
        ]
        return "{" + ",".join(members) + "}"


@dataclass
class Ids:
    """Ids unique to one line, so that answers can be counted per request."""

    counter: int = 1_000_000
    used: Counter[Any] = field(default_factory=Counter)

    def fresh(self, rng: random.Random) -> str:
        self.counter += 1
        if rng.random() < 0.5:
            return str(self.counter)
        return json.dumps(f"r#{self.counter}")[:-1] + rng.choice(["", "\\u00e9", "\\ud800"]) + '"'


def members_text(members: list[tuple[str, str]], rng: random.Random) -> str:
    space = rng.choice(["", "", "", " "])
    return "{" + f",{space}".join(f"{dumped(key)}:{space}{value}" for key, value in members) + "}"


class Messages:
    """Well-formed messages of each side as (member, source) lists, and their mutations."""

    def __init__(self, rng: random.Random, values: Values, ids: Ids) -> None:
        self.rng = rng
        self.values = values
        self.ids = ids
        self.made: Counter[str] = Counter()

    def params(self, method: str) -> list[tuple[str, str]]:
        rng = self.rng
        members = [("sessionId", dumped(rng.choice(["sess-1", "sess-2", "s"])))]
        if method in ("session/new", "session/load", "session/resume", "session/fork"):
            members += [("cwd", '"/"'), ("mcpServers", "[]")]
            if rng.random() < 0.6:
                text = odd_string(rng)
                members.append(
                    (
                        "systemPrompt",
                        f'{{"mode":"append","content":[{{"type":"text","text":{text}}}]}}',
                    )
                )
        elif method == "$/cancel_request":
            members = [("requestId", str(self.ids.counter - rng.randint(0, 20)))]
        elif method == "initialize":
            members = [("protocolVersion", "1")]
        elif method == "session/prompt":
            members.append(("prompt", '[{"type":"text","text":"hi"}]'))
        members.append(("x", self.values.any(1)))
        return members

    def client_message(self) -> list[tuple[str, str]]:
        rng = self.rng
        method = rng.choice(CLIENT_METHODS)
        params = members_text(self.params(method), rng)
        roll = rng.random()
        if roll < 0.5:
            return [("jsonrpc", '"2.0"'), ("id", self.ids.fresh(rng)),
                    ("method", dumped(method)), ("params", params)]  # fmt: skip
        if roll < 0.8:
            return [("jsonrpc", '"2.0"'), ("method", dumped(method)), ("params", params)]
        return [("jsonrpc", '"2.0"'), ("id", self.values.any(2)), ("result", self.values.any())]

    def agent_message(self, index: int) -> list[tuple[str, str]]:
        rng = self.rng
        method = rng.choice(AGENT_METHODS)
        params = members_text([("sessionId", '"sess-1"'), ("update", self.values.any(1))], rng)
        roll = rng.random()
        if roll < 0.55:
            return [("jsonrpc", '"2.0"'), ("method", dumped(method)), ("params", params)]
        if roll < 0.75:
            return [("jsonrpc", '"2.0"'), ("id", f'"agent-{index}"'),
                    ("method", dumped(method)), ("params", params)]  # fmt: skip
        if roll < 0.85:
            return [("jsonrpc", '"2.0"'), ("method", '"$/cancel_request"'),
                    ("params", f'{{"requestId":{self.values.any(2)}}}')]  # fmt: skip
        member = rng.choice(["result", "error"])
        value = self.values.any() if member == "result" else '{"code":-32000,"message":"no"}'
        return [("jsonrpc", '"2.0"'), ("id", self.values.any(2)), (member, value)]

    def mutate(self, members: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Every member of the message may get a value of any JSON type, go, come twice,
        or move; params members too."""
        rng = self.rng
        members = list(members)
        for _ in range(rng.randint(1, 2)):
            roll = rng.random()
            at = rng.randrange(len(members)) if members else 0
            if roll < 0.45 and members:
                key, value = members[at]
                if key == "params" and value.startswith("{") and rng.random() < 0.5:
                    inner = [(k, self.values.any(1)) for k in rng.sample(PARAM_KEYS, 2)]
                    members[at] = (key, members_text(inner, rng))
                else:
                    members[at] = (key, self.values.any())
                self.made[f"{key} retyped"] += 1
            elif roll < 0.6 and members:
                del members[at]
                self.made["member dropped"] += 1
            elif roll < 0.75:
                members.insert(at, (rng.choice(KEYS), self.values.any()))
                self.made["member added or repeated"] += 1
            else:
                rng.shuffle(members)
        return members


@dataclass
class Oracle:
    """What the client sent that must (or may) be answered."""

    must: set[Any] = field(default_factory=set)
    ids: Counter[Any] = field(default_factory=Counter)
    untouched: list[bytes] = field(default_factory=list)
    lines: dict[Any, bytes] = field(default_factory=dict)  # for the report of a failure

    def add(self, line: bytes) -> None:
        """Read ``line`` as the bridge and the agent will: note the requests in it."""
        try:
            frame = jsonrpc.parse(line)
        except jsonrpc.FrameError as exc:
            # Answered, if at all, under the id the line named before its fault (judged
            # only where the error does not name one: judging is half of this oracle's
            # cost).
            request_id: Any = exc.request_id
            if not isinstance(request_id, (int, str)):
                envelope, fault = json_stream.judge(line)
                request_id = fault.request_id if fault is not None else envelope.request_id()
            if type(request_id) in (int, str):
                self.ids[request_id] += 1
                self.lines[request_id] = line
            return
        try:
            plain = read_json(line)  # what the in-memory agent can read
            agent_reads = True
        except (ValueError, RecursionError):
            plain, agent_reads = None, False
        messages = frame.message if frame.kind is jsonrpc.Kind.BATCH else [frame.message]
        intercepted_in_batch = frame.kind is jsonrpc.Kind.BATCH and any(
            isinstance(m, dict) and m.get("method") in ("initialize", "session/new",
            "session/load", "session/resume", "session/fork", "session/prompt") for m in messages
        )  # fmt: skip
        for member in messages:
            if not isinstance(member, dict) or "id" not in member:
                continue
            request_id = member["id"]
            if type(request_id) not in (int, str):
                continue
            self.ids[request_id] += 1
            self.lines[request_id] = line
            try:
                kind = jsonrpc.classify_message(member, b"").kind
            except jsonrpc.FrameError:
                if "method" in member or frame.kind is jsonrpc.Kind.BATCH:
                    self.must.add(request_id)  # the bridge answers it itself
                continue
            if kind is jsonrpc.Kind.REQUEST and (agent_reads or intercepted_in_batch):
                self.must.add(request_id)
        if (
            plain is not None
            and frame.kind is jsonrpc.Kind.NOTIFICATION
            and frame.method in ("x/unknown", "_ext/method")
        ):
            self.untouched.append(line)


def valid_jsonrpc(line: bytes) -> bool:
    """Whether ``line`` is one valid JSON-RPC message or batch (of any depth)."""
    try:
        frame = jsonrpc.parse(line)
    except jsonrpc.NestedTooDeeply:
        envelope, fault = json_stream.judge(line)
        if fault is not None:
            return False
        try:
            envelope.kind()
        except jsonrpc.FrameError:
            return False
        return True
    except jsonrpc.FrameError:
        return False
    members = frame.message if frame.kind is jsonrpc.Kind.BATCH else [frame.message]
    for member in members:
        try:
            jsonrpc.classify_message(member, b"")
        except jsonrpc.FrameError:
            return False
    return True


class Lines:
    """Whole lines of one side: messages, mutated or not, batches, and line-level damage."""

    def __init__(self, rng: random.Random, messages: Messages, make: Any) -> None:
        self.rng = rng
        self.messages = messages
        self.make = make
        self.made: Counter[str] = Counter()

    def message(self) -> str:
        members = self.make()
        if self.rng.random() < 0.6:
            members = self.messages.mutate(members)
        return members_text(members, self.rng)

    def line(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.03:
            self.made["blank or whitespace"] += 1
            return rng.choice([b"", b"", b" ", b"\t", b"\r", b"  \r"])
        if roll < 0.13:
            self.made["batches"] += 1
            members = [self.message() for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.3:
                members.insert(rng.randrange(len(members) + 1), self.messages.values.any(2))
            if rng.random() < 0.05:
                members = ["[" + ",".join(members) + "]"]
            return ("[" + ",".join(members) + "]").encode()
        if roll < 0.14:
            self.made["empty batches and non-objects"] += 1
            return rng.choice([b"[]", b"{}", b"42", b'"x"', b"null"])
        text = self.message().encode()
        if roll < 0.16:
            self.made["bytes changed"] += 1
            at = rng.randrange(len(text))
            byte = rng.choice([*range(10), *range(11, 256)])  # a newline would split it
            return text[:at] + bytes([byte]) + text[at + 1 :]
        if roll < 0.17:
            self.made["cut short"] += 1
            return text[: rng.randrange(len(text))]
        if roll < 0.19:
            self.made["crlf"] += 1
            return text + b"\r"
        return text


@dataclass
class Run:
    """Both sides' generators, and what went each way."""

    values: Values
    messages: Messages
    client_lines: Lines
    agent_lines: Lines
    oracle: Oracle = field(default_factory=Oracle)
    sent_to_client: list[bytes] = field(default_factory=list)
    client_received: list[bytes] = field(default_factory=list)
    # The ids of the responses in client_received, in order: each line is read once.
    answered: list[Any] = field(default_factory=list)
    agent_received: list[bytes] = field(default_factory=list)

    @classmethod
    def seeded(cls, seed: int) -> Run:
        rng = random.Random(seed)
        values = Values(rng)
        messages = Messages(rng, values, Ids())
        count = iter(range(1, 1 << 30))
        return cls(
            values,
            messages,
            Lines(rng, messages, messages.client_message),
            Lines(rng, messages, lambda: messages.agent_message(next(count))),
        )

    async def relay(self) -> None:
        """Both sides write their lines, a few per write; the client then checks that
        the bridge still serves and waits for the answers it must get."""
        received = self.client_received
        async with bridge_over_memory(
            adapter="first-turn", agent_options={"piped_output": True}
        ) as (client, agent):

            async def read_client() -> None:
                while True:
                    while b"\n" not in client.buffer:
                        data = await client.receive_stream.receive_some(1 << 20)
                        if not data:
                            return
                        client.buffer += data
                    *lines, client.buffer = client.buffer.split(b"\n")
                    received.extend(lines)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_client)
                for start in range(0, max(CLIENT_LINES, AGENT_LINES), LINES_PER_WRITE):
                    count = min(LINES_PER_WRITE, CLIENT_LINES - start)
                    from_client = [self.client_lines.line() for _ in range(count)]
                    for line in from_client:
                        self.oracle.add(line.removesuffix(b"\r"))
                    if from_client:
                        await client.send_stream.send_all(b"\n".join(from_client) + b"\n")
                    count = min(LINES_PER_WRITE, AGENT_LINES - start)
                    from_agent = [self.agent_lines.line() for _ in range(count)]
                    self.sent_to_client += from_agent
                    if from_agent:
                        await agent.send_bytes(b"\n".join(from_agent) + b"\n")
                    await trio.testing.wait_all_tasks_blocked()
                await client.send_stream.send_all(
                    b'{"jsonrpc":"2.0","id":"alive","method":"_test/echo","params":{}}\n'
                )
                # Each wait reads only the lines that came since it last looked.
                seen = 0
                with trio.fail_after(120):
                    while not any(b'"alive"' in line for line in received[seen:]):
                        seen = len(received)
                        await trio.sleep(0.01)
                # Answers held behind a session's interceptions may still be on their way:
                # each interception of a session waits for the one before it, and each may
                # make a store call in a worker thread. Wait as long as answers come; a
                # bridge that stopped serving makes no progress for STALLED seconds.
                waiting, seen = set(self.oracle.must), 0
                while waiting:
                    with trio.move_on_after(STALLED):
                        while len(received) == seen:
                            await trio.sleep(0.05)
                    if len(received) == seen:
                        break
                    came = answers(received[seen:])
                    self.answered += came
                    waiting -= {rid for rid in came if isinstance(rid, (int, str))}
                    seen = len(received)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
            self.answered += answers(received[seen:])
            self.agent_received = agent.received_raw


async def test_mutated_frames_from_both_sides_never_break_the_bridge() -> None:
    run = Run.seeded(SEED)
    with trio.fail_after(900):
        await run.relay()
    oracle, values, messages = run.oracle, run.values, run.messages
    client_lines, agent_lines = run.client_lines, run.agent_lines
    client_received, agent_received = run.client_received, run.agent_received
    sent_to_client = run.sent_to_client
    invalid_to_client = [line for line in client_received if not valid_jsonrpc(line)]
    invalid_to_agent = [line for line in agent_received if not valid_jsonrpc(line)]
    answered = Counter(run.answered)
    own = {rid for rid, count in oracle.ids.items() if count == 1}
    unanswered = sorted(oracle.must - set(answered), key=str)
    twice = sorted((rid for rid in own if answered[rid] > 1), key=str)
    sent_whole = {line.removesuffix(b"\r") for line in sent_to_client}
    updates = [line for line in client_received if is_notification(line, b"session/update")]
    print(
        f"\nrelay fuzz: {CLIENT_LINES} client lines, {AGENT_LINES} agent lines; "
        f"made {dict(client_lines.made + agent_lines.made)}, {dict(values.made)}, "
        f"{dict(messages.made)}; the client got {len(client_received)} lines "
        f"({sum(answered.values())} answers, {len(oracle.must)} requests that must be "
        f"answered), the agent {len(agent_received)}; {len(invalid_to_client)} invalid "
        f"to the client, {len(invalid_to_agent)} to the agent, {len(unanswered)} "
        f"unanswered, {len(twice)} answered twice"
    )
    assert invalid_to_client == [], invalid_to_client[:3]
    assert invalid_to_agent == [], invalid_to_agent[:3]
    assert (unanswered, twice) == ([], []), [
        (rid, oracle.lines.get(rid, rid)[:300]) for rid in [*unanswered[:5], *twice[:5]]
    ]
    agent_got = set(agent_received)
    missing = [line for line in oracle.untouched if line not in agent_got]
    assert oracle.untouched and not missing, missing[:3]
    # Updates nothing was changed in arrive as the agent wrote them.
    changed = [line for line in updates if line not in sent_whole]
    assert updates and not changed, changed[:3]
    assert values.made["deep values"] > 300 and values.made["huge numbers"] > 3000


def is_notification(line: bytes, method: bytes) -> bool:
    if not line.startswith(b"{") or method not in line[:80]:
        return False
    try:
        return jsonrpc.parse(line).kind is jsonrpc.Kind.NOTIFICATION
    except jsonrpc.FrameError:
        return False


def answers(lines: list[bytes]) -> list[Any]:
    """The ids of the responses in ``lines``, batch members included, in order."""
    found = []
    for line in lines:
        try:
            message = read_json(line)
        except (ValueError, RecursionError):  # deeper than the agent reads
            message = json_stream.judge(line)[0].skeleton()
        for member in message if isinstance(message, list) else [message]:
            if isinstance(member, dict) and "method" not in member and "id" in member:
                found.append(member["id"])
    return found
