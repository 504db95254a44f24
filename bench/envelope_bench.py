"""What reading a frame's envelope costs, per frame, for the frames a session is made of.

    python bench/envelope_bench.py [--seconds 0.3]

For each frame (typical ``session/update`` notifications, a request, a response and a
1 MiB frame) it times, in frames per second:

* ``parse``: ``jsonrpc.parse``, what the relay calls on every frame today;
* ``json.loads``: the bare decode, no classification;
* ``scan``: ``envelope.scan``, json's C scanner without the decoder's wrapper, classified
  in place (exact, validates the whole line);
* ``token regex``: one ``re`` match of the line as a flat sequence of JSON tokens. It checks
  less than the JSON grammar (not nesting, not the order of tokens), so it is a lower bound
  for validating with ``re``; it shows that ``re`` is no faster a validator than json;
* ``prefix regex``: reading ``method`` and ``params.sessionId`` from the start of a line
  written in the common key order, validating nothing: what skipping validation would buy.

Then the CPU cost per frame of a relay's inner loop over one 64 KiB read full of
``agent_message_chunk`` notifications, without I/O: ``LineSplitter`` + ``parse`` (today),
``LineSplitter`` + ``scan``, and ``bytes.split`` + ``scan`` forwarding the read as it came;
and the same read through the sans-IO router (``Router.receive_from_agent``) as the runtime
calls it today (``parse``), with ``scan`` and ``Envelope.frame()``, and with ``scan``
handing the router the envelope itself (which has every attribute of a ``Frame`` the
router reads).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from typing import Any, Final, cast

from acp_bridge import jsonrpc
from acp_bridge.core.router import Router
from acp_bridge.envelope import scan
from acp_bridge.framing import LineSplitter, join_lines

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
        "json.loads": json.loads,
        "scan": scan,
        "token regex": TOKEN_REGEX.fullmatch,
        "prefix regex": PREFIX_REGEX.match,
    }
    print(f"{'frame':28} {'bytes':>8} " + " ".join(f"{name:>13}" for name in readers))
    for name, message in FRAMES.items():
        raw = jsonrpc.encode(message)
        assert scan(raw) is not None
        rates = [max(rate(read, raw, args.seconds) for _ in range(3)) for read in readers.values()]
        print(f"{name:28} {len(raw):8} " + " ".join(f"{r:>11,.0f}/s" for r in rates))
    print("frames per second of CPU time, best of 3")
    print()
    pipeline(args.seconds)


def pipeline(seconds: float) -> None:
    line = jsonrpc.encode(FRAMES["agent_message_chunk"]) + b"\n"
    chunk = line * (65536 // len(line))
    frames = chunk.count(b"\n")

    def split_parse(data: bytes) -> None:
        out = [jsonrpc.parse(item.data).raw for item in LineSplitter().feed(data)]  # type: ignore[union-attr]
        b"".join(join_lines(out))

    def split_scan(data: bytes) -> None:
        out = []
        for item in LineSplitter().feed(data):
            envelope = scan(item.data)  # type: ignore[union-attr]
            assert envelope is not None
            out.append(envelope.raw)
        b"".join(join_lines(out))

    def bytes_split_scan(data: bytes) -> None:
        # Nothing changed: the read goes out as it came, no per-frame copy.
        lines = data.split(b"\n")
        lines.pop()
        for item in lines:
            if scan(item) is None:
                raise AssertionError(item)

    written: list[bytes] = []
    router = Router(lambda hop, raw: written.append(raw))

    def router_parse(data: bytes) -> None:
        written.clear()
        for item in LineSplitter().feed(data):
            router.receive_from_agent(0, jsonrpc.parse(item.data))  # type: ignore[union-attr]

    def router_scan_frame(data: bytes) -> None:
        written.clear()
        for item in LineSplitter().feed(data):
            envelope = scan(item.data)  # type: ignore[union-attr]
            assert envelope is not None
            router.receive_from_agent(0, envelope.frame())

    def router_scan(data: bytes) -> None:
        written.clear()
        for item in LineSplitter().feed(data):
            envelope = scan(item.data)  # type: ignore[union-attr]
            assert envelope is not None
            router.receive_from_agent(0, cast(jsonrpc.Frame, envelope))

    print(f"inner loop over a 64 KiB read of {frames} agent_message_chunk lines, no I/O:")
    for name, loop in [
        ("LineSplitter + parse", split_parse),
        ("LineSplitter + scan", split_scan),
        ("bytes.split + scan", bytes_split_scan),
        ("router, parse", router_parse),
        ("router, scan + frame()", router_scan_frame),
        ("router, scan", router_scan),
    ]:
        per_second = max(rate(loop, chunk, seconds) for _ in range(3)) * frames
        print(f"  {name:22} {1e9 / per_second:7,.0f} ns/frame {per_second:12,.0f} frames/s")


if __name__ == "__main__":
    main()
