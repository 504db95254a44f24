"""What reading a frame costs, per frame, for the frames a session is made of.

    python bench/parse_bench.py [--seconds 0.3]

For each frame (typical ``session/update`` notifications, a request, a response and a
1 MiB frame) it times, in frames per second:

* ``parse``: ``jsonrpc.parse``, what the relay calls on every frame (json's C scanner,
  classified in place; validates the whole line);
* ``parse_in_full``: the long way ``parse`` takes for unusual lines (``JSONDecoder.decode``
  and ``classify_message``), what the relay called on every frame before;
* ``json.loads``: the bare decode, no classification;
* ``token regex``: one ``re`` match of the line as a flat sequence of JSON tokens. It checks
  less than the JSON grammar (not nesting, not the order of tokens), so it is a lower bound
  for validating with ``re``; it shows that ``re`` is no faster a validator than json;
* ``prefix regex``: reading ``method`` and ``params.sessionId`` from the start of a line
  written in the common key order, validating nothing: what skipping validation would buy.

Then the CPU cost per frame of the relay's inner loop over one 64 KiB read full of
``agent_message_chunk`` notifications, without I/O: ``LineSplitter`` + ``parse`` alone;
the line-by-line path through the router (``LineSplitter`` + ``parse`` +
``Router.receive_from_agent``), which the runtime takes for reads it cannot take the fast
way, beside ``parse_in_full``; and the fast path the runtime takes for a read of short
lines (``LineSplitter.feed_short`` + ``Router.pass_notifications_from_agent``: every line
validated, the run passed on as one piece).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from typing import Any, Final

from acp_bridge.core.router import Router
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import LineSplitter

FRAMES: Final = {
    "agent_message_chunk": {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "Hello! How can I help you"},
            },
        },
    },
    "tool_call": {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "update": {
                "sessionUpdate": "tool_call",
                "toolCallId": "toolu_01ABCDEF",
                "title": "Read src/main.py",
                "kind": "read",
                "status": "pending",
                "locations": [{"path": "/home/user/project/src/main.py", "line": 1}],
                "rawInput": {"file_path": "/home/user/project/src/main.py", "limit": 200},
            },
        },
    },
    "tool_call_update (4 KiB)": {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "update": {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "toolu_01ABCDEF",
                "status": "completed",
                "content": [
                    {"type": "content", "content": {"type": "text", "text": "line\n" * 820}}
                ],
            },
        },
    },
    "session/prompt request": {
        "jsonrpc": "2.0",
        "id": 12,
        "method": "session/prompt",
        "params": {
            "sessionId": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "prompt": [{"type": "text", "text": "Explain this function, please."}],
        },
    },
    "response": {"jsonrpc": "2.0", "id": 12, "result": {"stopReason": "end_turn"}},
    "1 MiB request": {
        "jsonrpc": "2.0",
        "id": 13,
        "method": "session/prompt",
        "params": {
            "sessionId": "s",
            "prompt": [{"type": "image", "mimeType": "image/png", "data": "A" * (1 << 20)}],
        },
    },
}

TOKEN_REGEX: Final = re.compile(
    rb'(?:[ \t\n\r]*(?:"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"'
    rb"|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null|[{}\[\],:]))*"
    rb"[ \t\n\r]*"
)
PREFIX_REGEX: Final = re.compile(
    rb'\{"jsonrpc":"2\.0",(?:"id":(-?[0-9]+|"[^"\\]*"),)?"method":"([^"\\]*)"'
    rb'(?:,"params":\{"sessionId":"([^"\\]*)")?'
)


def rate(read: Callable[[bytes], Any], raw: bytes, seconds: float) -> float:
    """Calls per second of this process's CPU time: on a shared machine, time spent
    waiting for a core is not counted."""
    count, batch = 0, 16
    started = time.process_time()
    deadline = started + seconds
    while (now := time.process_time()) < deadline:
        for _ in range(batch):
            read(raw)
        count += batch
        if now - started < seconds / 10:
            batch *= 2
    return count / (time.process_time() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="per figure, best of 3")
    args = parser.parse_args()
    readers: dict[str, Callable[[bytes], Any]] = {
        "parse": jsonrpc.parse,
        "parse_in_full": jsonrpc.parse_in_full,
        "json.loads": json.loads,
        "token regex": TOKEN_REGEX.fullmatch,
        "prefix regex": PREFIX_REGEX.match,
    }
    print(f"{'frame':28} {'bytes':>8} " + " ".join(f"{name:>13}" for name in readers))
    for name, message in FRAMES.items():
        raw = jsonrpc.encode(message)
        rates = [max(rate(read, raw, args.seconds) for _ in range(3)) for read in readers.values()]
        print(f"{name:28} {len(raw):8} " + " ".join(f"{r:>11,.0f}/s" for r in rates))
    print("frames per second of CPU time, best of 3")
    print()
    pipeline(args.seconds)


def pipeline(seconds: float) -> None:
    line = jsonrpc.encode(FRAMES["agent_message_chunk"]) + b"\n"
    chunk = line * (65536 // len(line))
    frames = chunk.count(b"\n")

    # The runtime takes what the router has to send after every call (Connection.carry_out).
    router = Router()

    def router_parse(data: bytes) -> None:
        for item in LineSplitter().feed(data):
            router.receive_from_agent(0, jsonrpc.parse(item.data))  # type: ignore[union-attr]
            router.data_to_send()

    def router_parse_in_full(data: bytes) -> None:
        for item in LineSplitter().feed(data):
            router.receive_from_agent(0, jsonrpc.parse_in_full(item.data))  # type: ignore[union-attr]
            router.data_to_send()

    def split_parse(data: bytes) -> None:
        for item in LineSplitter().feed(data):
            jsonrpc.parse(item.data)  # type: ignore[union-attr]

    def fast_path(data: bytes) -> None:
        # As the runtime's Pumps._lines does it; every line here is a plain notification.
        lines = LineSplitter().feed_short(data)
        assert lines is not None
        index = 0
        while index < len(lines):
            index, frame = router.pass_notifications_from_agent(lines, index)
            router.data_to_send()
            if index < len(lines):
                router.receive_from_agent(0, frame or jsonrpc.parse(lines[index]))
                router.data_to_send()
                index += 1

    print(f"inner loop over a 64 KiB read of {frames} agent_message_chunk lines, no I/O:")
    for name, loop in [
        ("LineSplitter + parse", split_parse),
        ("router, parse", router_parse),
        ("router, parse_in_full", router_parse_in_full),
        ("fast path", fast_path),
    ]:
        per_second = max(rate(loop, chunk, seconds) for _ in range(3)) * frames
        print(f"  {name:22} {1e9 / per_second:7,.0f} ns/frame {per_second:12,.0f} frames/s")


if __name__ == "__main__":
    main()
