"""What judging a long line costs: the piecewise validator beside json's own decoder.

    python bench/long_line_bench.py [--mib 16] [--repeat 3]

A line of ``bridge.stream_after`` bytes or more is judged by
``json_stream.LineValidator`` as it arrives, in the pieces the pipe delivers, without
building its value. For lines of different content (one long string, code with escapes,
non-ASCII text, a base64 image block, many small objects, a flat array of numbers) it
prints MiB per second of CPU time for the validator fed in 64 KiB and in 1 MiB pieces,
beside ``json.loads`` of the whole line, and the peak memory each needs beyond the line.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import Any

from acp_bridge.wire.json_stream import LineValidator

MiB = 1024 * 1024


def lines(size: int) -> dict[str, bytes]:
    code = 'def f(x):\n\treturn "a\\b" + x\n'
    return {
        "one long string": b'{"jsonrpc":"2.0","id":1,"method":"bench/echo","params":{"blob":"'
        + b"x" * size
        + b'"}}',
        "code with escapes": json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "fs/write_text_file",
             "params": {"content": code * (size // len(code))}}
        ).encode(),
        "non-ASCII text": json.dumps(
            {"jsonrpc": "2.0", "id": 1, "result": "é漢字" * (size // 8)}, ensure_ascii=False
        ).encode(),
        "base64 image block": json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
             "params": {"sessionId": "s", "prompt": [
                 {"type": "text", "text": "hi"},
                 {"type": "image", "mimeType": "image/png", "data": "QUJD+/==" * (size // 8)}]}}
        ).encode(),
        "many small objects": json.dumps(
            {"jsonrpc": "2.0", "id": 1,
             "result": {"items": [{"a": n, "b": "xx"} for n in range(size // 20)]}}
        ).encode(),
        "flat array of numbers": json.dumps(
            {"jsonrpc": "2.0", "id": 1, "result": list(range(size // 8))}
        ).encode(),
    }  # fmt: skip


def validate(line: bytes, piece: int) -> None:
    validator = LineValidator()
    for start in range(0, len(line), piece):
        validator.feed(line[start : start + piece])
    validator.finish()


def best(job: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        job()
        times.append(time.process_time() - start)
    return min(times)


def peak(job: Callable[[], Any]) -> float:
    tracemalloc.start()
    job()
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return top / MiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    header = (f"{'line':24s} {'MiB':>5s} {'64 KiB pieces':>14s} {'1 MiB pieces':>13s} "
              f"{'json.loads':>11s}   extra memory: validator / json.loads")  # fmt: skip
    print(header)
    for name, line in lines(args.mib * MiB).items():
        size = len(line) / MiB
        small = size / best(partial(validate, line, 64 * 1024), args.repeat)
        large = size / best(partial(validate, line, MiB), args.repeat)
        whole = size / best(partial(json.loads, line), args.repeat)
        memory = peak(partial(validate, line, MiB)), peak(partial(json.loads, line))
        print(f"{name:24s} {size:5.1f} {small:9.0f} MiB/s {large:8.0f} MiB/s {whole:6.0f} MiB/s"
              f"   {memory[0]:6.1f} / {memory[1]:6.1f} MiB")  # fmt: skip
    print("MiB per second of CPU time, best of", args.repeat)


if __name__ == "__main__":
    main()
