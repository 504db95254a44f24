"""Seeded fuzzing of the wire layer: parse, encode, trace and systemPrompt validation.

Random and mutated frames — lone surrogates, deep nesting, odd ids, batches, huge and
out-of-range numbers, broken UTF-8, truncations — go through :func:`jsonrpc.parse`,
:func:`jsonrpc.encode`, the tracer and :func:`parse_system_prompt`. Nothing may raise but
the defined errors (:class:`FrameError` with -32700/-32600, :class:`PromptRejected` with
-32602 naming a ``systemPrompt`` field), and whatever the bridge writes must be one line of
valid JSON that reads back as what was encoded.

Bounded: a fixed seed, a fixed number of inputs (a quarter of it unless
``ACP_BRIDGE_FULL_FUZZ=1``, :mod:`fuzz_size`), and a time budget that stops early on a
slow machine (the count reached is printed with ``-s``).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from fuzz_size import inputs

from acp_bridge.core.system_prompt import PromptRejected, SystemPrompt, parse_system_prompt
from acp_bridge.runtime.trace import Tracer, redact
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import FrameError, Kind

SEED: Final = 20261201
FRAMES: Final = inputs(12_000)
PROMPTS: Final = inputs(6_000)
BUDGET_SECONDS: Final = 20.0

TEXTS: Final = [
    "",
    "a",
    "Be brief.",
    "\ud800",
    "x\udfffy",
    "\ud83d\ude00",
    "🦜",
    "\x00",
    "\u2028\u2029",
    "\ufeff",
    "\r\n",
    '"\\',
    "é" * 3,
    "{{ x }}",
]
METHODS: Final = [
    "initialize",
    "session/new",
    "session/load",
    "session/prompt",
    "session/update",
    "$/cancel_request",
    "_x/y",
    "",
]
ODD_IDS: Final[list[Any]] = [
    0,
    -1,
    2**63,
    10**30,
    1.5,
    -0.0,
    1e308,
    True,
    False,
    None,
    "",
    "\ud800",
    [],
    {},
    [1],
    {"a": 1},
]


def strict_loads(raw: bytes) -> Any:
    """JSON as a strict peer reads it: UTF-8, no NaN/Infinity (integers of any length)."""

    def refuse(name: str) -> Any:
        raise ValueError(name)

    return json.loads(raw.decode("utf-8"), parse_constant=refuse, parse_int=jsonrpc._parse_int)


def same_json(a: Any, b: Any) -> bool:
    """Equality that tells 1 from True and 1.0 (JSON keeps them apart)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


class Generator:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def text(self) -> str:
        r = self.rng
        if r.random() < 0.5:
            return r.choice(TEXTS)
        return "".join(
            chr(r.choice([r.randrange(0x20, 0x7F), r.randrange(0, 0x110000)]))
            for _ in range(r.randrange(0, 12))
        )

    def number(self) -> Any:
        r = self.rng
        return r.choice(
            [
                r.randrange(-(10**6), 10**6),
                r.random() * 10 ** r.randrange(-300, 300),
                2**64,
                -(2**100),
                10 ** r.randrange(20, 400),
            ]
        )

    def value(self, depth: int = 0) -> Any:
        r = self.rng
        kind = r.randrange(8 if depth < 6 else 4)
        if kind == 0:
            return self.text()
        if kind == 1:
            return self.number()
        if kind == 2:
            return r.choice([True, False, None])
        if kind == 3:
            return r.choice(ODD_IDS)
        if kind in (4, 5):
            return {self.text(): self.value(depth + 1) for _ in range(r.randrange(0, 4))}
        return [self.value(depth + 1) for _ in range(r.randrange(0, 4))]

    def message(self) -> Any:
        r = self.rng
        message: dict[str, Any] = {"jsonrpc": r.choice(["2.0", "2.0", "2.0", "1.0", 2])}
        shape = r.randrange(4)
        if shape in (0, 1):
            message["method"] = r.choice([*METHODS, self.text(), 7])
        if shape in (0, 2):
            message["id"] = r.choice([*ODD_IDS, r.randrange(100), self.text()])
        if shape == 2:
            message[r.choice(["result", "error"])] = self.value()
        if r.random() < 0.7:
            message["params"] = r.choice(
                [{"systemPrompt": self.prompt_value()}, self.value(), {"requestId": self.value()}]
            )
        return message

    def frame_value(self) -> Any:
        r = self.rng
        choice = r.randrange(10)
        if choice == 0:
            return [self.message() for _ in range(r.randrange(0, 5))]  # a batch
        if choice == 1:
            return self.value()
        return self.message()

    def prompt_value(self) -> Any:
        r = self.rng
        if r.random() < 0.1:
            return self.value()
        prompt: dict[str, Any] = {
            "mode": r.choice(["append"] * 5 + ["override"] * 3 + ["_custom", None, 1, ""]),
            "content": [self.block() for _ in range(r.randrange(0 if r.random() < 0.1 else 1, 4))],
        }
        for key in ("_meta", "meta", "extra"):
            if r.random() < 0.25:
                prompt[key] = r.choice([self.value(4), {self.text(): self.value(4)}])
        if r.random() < 0.05:
            del prompt[r.choice(["mode", "content"])]
        if r.random() < 0.05:
            prompt["content"] = self.value(4)
        return prompt

    def block(self) -> Any:
        r = self.rng
        if r.random() < 0.03:
            return self.value(4)
        block: dict[str, Any] = {
            "type": r.choice(["text"] * 12 + ["image", None]),
            "text": self.text(),
        }
        for key in ("annotations", "_meta", "meta"):
            if r.random() < 0.1:
                block[key] = r.choice([self.value(5), {self.text(): self.value(5)}])
        if r.random() < 0.03:
            block["text"] = self.value(5)
        return block

    def line(self) -> bytes:
        """A frame's bytes: encoded, hand-made or mutated."""
        r = self.rng
        choice = r.randrange(10)
        if choice == 0:
            depth = r.choice([10, 500, 990, 1000, 5000])
            opener, closer = r.choice([(b"[", b"]"), (b'{"a":', b"}")])
            return (
                b'{"jsonrpc":"2.0","id":1,"method":"x","params":'
                + opener * depth
                + b"1"
                + closer * depth
                + b"}"
            )
        if choice == 1:
            number = r.choice(
                [
                    b"1e400",
                    b"-1e999",
                    b"1" * 5000,
                    b"0." + b"0" * 400 + b"1",
                    b"NaN",
                    b"Infinity",
                    b"-0",
                ]
            )
            return b'{"jsonrpc":"2.0","id":' + number + b',"method":"x"}'
        if choice == 2:
            params = b'{"t":"\\ud800","u":"\\udc00\\ud800"}'
            return b'{"jsonrpc":"2.0","id":1,"method":"x","params":' + params + b"}"
        raw = json.dumps(self.frame_value(), ensure_ascii=r.random() < 0.5, allow_nan=True).encode(
            "utf-8", "surrogatepass"
        )
        if r.random() < 0.4:
            raw = self.mutate(raw)
        return raw

    def mutate(self, raw: bytes) -> bytes:
        r = self.rng
        data = bytearray(raw)
        for _ in range(r.randrange(1, 4)):
            op = r.randrange(6)
            at = r.randrange(len(data) + 1)
            if op == 0 and data:
                data[min(at, len(data) - 1)] = r.randrange(256)
            elif op == 1:
                del data[at:]
            elif op == 2:
                data[at:at] = r.choice(
                    [
                        b"\xff",
                        b"\xed\xa0\x80",
                        b"\\ud800",
                        b"\x00",
                        b"[",
                        b'"',
                        b"\xef\xbb\xbf",
                        b"\r",
                    ]
                )
            elif op == 3:
                data = bytearray(b"\xef\xbb\xbf") + data
            elif op == 4:
                data = data + data
            else:
                data[at:at] = b'"id":[1],'
        return bytes(data)


def within_budget(count: int, started: float) -> Iterator[int]:
    for index in range(count):
        if time.monotonic() - started > BUDGET_SECONDS:
            return
        yield index


def check_encoded(raw: bytes, message: Any) -> None:
    """``raw`` is one line of strict JSON that reads back as ``message``."""
    assert b"\n" not in raw
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit * 3)  # the checks' own stack, not the code under test
    try:
        again = strict_loads(raw)
        # encode is deterministic and tells 1 from 1.0 from true: equal bytes, equal JSON.
        assert jsonrpc.encode(again) == raw
        assert jsonrpc.encode(message) == raw
    finally:
        sys.setrecursionlimit(limit)


def deeper(depth: int, action: Callable[[], bytes]) -> bytes:
    return deeper(depth - 1, action) if depth else action()


def test_fuzz_parse_encode_and_trace(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    gen = Generator(rng)
    tracer = Tracer(tmp_path / "trace.jsonl")
    tried = violations = frames = errors = 0
    failures: list[str] = []
    started = time.monotonic()
    for _ in within_budget(FRAMES, started):
        raw = gen.line()
        tried += 1
        try:
            try:
                frame = jsonrpc.parse(raw)
            except FrameError as exc:
                errors += 1
                assert exc.code in (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST)
                assert jsonrpc.is_request_id(exc.request_id)
                check_encoded(
                    jsonrpc.encode(jsonrpc.error_response(exc.request_id, exc.code, exc.message)),
                    jsonrpc.error_response(exc.request_id, exc.code, exc.message),
                )
                tracer.record("client->bridge", raw, None)
                continue
            frames += 1
            assert frame.raw == raw
            # A batch's value is its members (the frame reads them as they are walked).
            message = list(frame.message) if frame.kind is Kind.BATCH else frame.message
            if frame.kind is not Kind.BATCH:
                assert jsonrpc.is_request_id(frame.id)
            check_encoded(jsonrpc.encode(message), message)
            changed = {**message, "id": "acp-bridge-1"} if isinstance(message, dict) else message
            check_encoded(deeper(rng.randrange(0, 60), lambda: jsonrpc.encode(changed)), changed)  # noqa: B023
            for member in message if frame.kind is Kind.BATCH else []:
                try:
                    jsonrpc.classify_message(member)
                except FrameError as exc:
                    assert exc.code == jsonrpc.INVALID_REQUEST
            redact(message)
            tracer.record("client->bridge", raw, frame.message)
        except Exception as exc:  # every other exception is the finding
            violations += 1
            if len(failures) < 5:
                failures.append(f"{type(exc).__name__}: {exc} for {raw[:120]!r}")
    tracer.close()
    trace_lines = (tmp_path / "trace.jsonl").read_bytes().splitlines()
    for line in trace_lines:
        try:
            strict_loads(line)
        except ValueError as exc:
            violations += 1
            failures.append(f"trace line is not JSON: {exc}")
    print(
        f"\nwire fuzz: {tried} lines tried ({frames} frames, {errors} defined errors), "
        f"{len(trace_lines)} trace lines, {violations} violations"
    )
    assert violations == 0, failures
    assert tried >= min(FRAMES, 500)


def test_fuzz_system_prompt_validation() -> None:
    rng = random.Random(SEED + 1)
    gen = Generator(rng)
    tried = violations = accepted = rejected = 0
    failures: list[str] = []
    started = time.monotonic()
    for _ in within_budget(PROMPTS, started):
        value = gen.prompt_value()
        # Through the wire as a client would send it, so only valid JSON values arrive.
        raw = json.dumps({"v": value}, allow_nan=False).encode("utf-8", "surrogatepass")
        value = jsonrpc.decode(raw.decode("utf-8", "surrogatepass"))["v"]
        tried += 1
        try:
            try:
                prompt = parse_system_prompt(
                    value,
                    override_allowed=rng.random() < 0.5,
                    max_bytes=rng.choice([8, 1024, 256 * 1024]),
                )
            except PromptRejected as rejection:
                rejected += 1
                error = rejection.error()
                assert error["code"] == jsonrpc.INVALID_PARAMS
                assert error["data"]["field"].startswith("systemPrompt")
                check_encoded(jsonrpc.encode(error), error)
                continue
            if prompt is None:
                assert value is None
                continue
            accepted += 1
            assert isinstance(prompt, SystemPrompt)
            wire = prompt.to_wire()
            check_encoded(jsonrpc.encode(wire), wire)
            assert SystemPrompt.from_wire(wire) == prompt
            prompt.fingerprint()
            if isinstance(value, dict) and "meta" in value:
                assert same_json(wire["meta"], value["meta"])
            if isinstance(value, dict) and "_meta" not in value:
                assert "_meta" not in wire
        except Exception as exc:  # every other exception is the finding
            violations += 1
            if len(failures) < 5:
                failures.append(f"{type(exc).__name__}: {exc} for {value!r:.200}")
    print(
        f"\nprompt fuzz: {tried} values tried ({accepted} accepted, {rejected} rejected "
        f"with -32602), {violations} violations"
    )
    assert violations == 0, failures
    assert tried >= min(PROMPTS, 500)


@pytest.mark.parametrize("limit", [sys.getrecursionlimit()])
def test_recursion_limit_is_restored_after_a_deep_encode(limit: int) -> None:
    deep: Any = 1
    for _ in range(limit - 50):
        deep = [deep]

    def encode_at(depth: int) -> bytes:
        return encode_at(depth - 1) if depth else jsonrpc.encode(deep)

    encode_at(100)
    assert sys.getrecursionlimit() == limit
