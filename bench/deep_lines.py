"""What judging a line of awkward shape costs: deep nesting, nesting gone wrong near its
end, many small members, integers longer than json reads.

    python bench/deep_lines.py [--mib 1]

``json_stream.LineValidator`` judges a line the router does not decode (a long line as it
arrives, a line too deep for json to build, a line json refused). Each shape below is one
line of about ``--mib`` MiB (the two ``one closer short`` lines are 12,000 levels), judged
whole (``json_stream.judge``) and fed in pieces of 997 bytes and of 128 KiB, the bridge's
read size. Printed per shape: the CPU milliseconds of each, and the most memory the
validator held at once while the line was fed in 128 KiB pieces (``tracemalloc``; the
pieces themselves included).

Run it with the interpreter of another install to measure that build's validator: the
script imports ``acp_bridge`` from wherever that interpreter finds it.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import Final

from long_line_bench import peak, validate

from acp_bridge.wire import json_stream
from acp_bridge.wire.jsonrpc import FrameError

MiB: Final = 1 << 20
READ: Final = 128 * 1024


def groups(opener: bytes, closer: bytes, depth: int, size: int) -> bytes:
    group = opener * depth + b"1" + closer * depth
    return b"[" + b",".join([group] * (size // (len(group) + 1))) + b"]"


def shapes(size: int) -> dict[str, bytes]:
    """Each shape as the value of a member of a notification's ``params``."""
    deep = 12_000
    return {
        "deep [": b"[" * (size // 2) + b"1" + b"]" * (size // 2),
        "deep [1,": b"[1," * (size // 4) + b"1" + b"]" * (size // 4),
        'deep {"d":': b'{"d":' * (size // 6) + b"1" + b"}" * (size // 6),
        "deep [1, with ,1] closing": b"[1," * (size // 7) + b"1" + b",1]" * (size // 7),
        'deep {"a":1,"d": with ,"b":2} closing': (
            b'{"a":1,"d":' * (size // 18) + b"1" + b',"b":2}' * (size // 18)
        ),
        "deep [ with spaced closers": b"[ " * (size // 4) + b"1" + b" ]" * (size // 4),
        "deep [{}, with ] closing": b"[{}," * (size // 5) + b"1" + b"]" * (size // 5),
        "deep [[1,2], with ] closing": b"[[1,2]," * (size // 8) + b"1" + b"]" * (size // 8),
        "deep [ with ,{}] closing": b"[" * (size // 5) + b"1" + b",{}]" * (size // 5),
        "deep [ with ,[1,2]] closing": b"[" * (size // 8) + b"1" + b",[1,2]]" * (size // 8),
        "deep [, one closer short": b"[" * deep + b"1" + b"]" * (deep - 1),
        'deep [{"d":, one closer short': b'[{"d":' * deep + b"1" + b"}]" * (deep - 1) + b"}",
        "groups of [ 990 deep": groups(b"[", b"]", 990, size),
        "groups of [1, 600 deep": groups(b"[1,", b"]", 600, size),
        'groups of {"d": 300 deep': groups(b'{"d":', b"}", 300, size),
        "many small objects": b"["
        + b",".join([b'{"a":1,"b":[1,2],"c":"x"}'] * (size // 26))
        + b"]",
        "many small arrays": b"[" + b",".join([b"[1,2.5,null]"] * (size // 13)) + b"]",
        "many members": b"{" + b",".join(b'"k%d":%d' % (i, i) for i in range(size // 14)) + b"}",
        "many strings with escapes": b"["
        + b",".join([b'"a \\"quoted\\" word"'] * (size // 23))
        + b"]",
        "many strings with commas": b"["
        + b",".join([b'"one, two, three, four"'] * (size // 24))
        + b"]",
        "one long string": b'"' + b"x" * size + b'"',
        "a string of backslashes": b'"' + b"\\" * size + b'"',
        "integers of 4,000 digits": numbers(4_000, size),
        "integers longer than json reads": numbers(5_000, size),
    }


def numbers(digits: int, size: int) -> bytes:
    """An array of integers of ``digits`` digits (json reads up to 4,300)."""
    number = b"7" * digits
    return b"[" + b",".join([number] * (size // (digits + 1))) + b"]"


def many_members(size: int) -> bytes:
    """A line whose top-level object has many small members besides the envelope."""
    members = b",".join(b'"k%d":%d' % (i, i) for i in range(size // 14))
    return b'{"jsonrpc":"2.0","method":"m",' + members + b"}"


def judged(line: bytes, piece: int) -> None:
    """The line fed in pieces of ``piece`` bytes and finished; the shapes cut short or
    wrong are judged all the same (their error taken)."""
    with contextlib.suppress(FrameError):
        validate(line, piece)


def cpu_ms(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return (time.process_time() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=1.0)
    args = parser.parse_args()
    size = int(args.mib * MiB)
    lines = {
        name: b'{"jsonrpc":"2.0","method":"m","params":{"v":%s}}' % body
        for name, body in shapes(size).items()
    }
    lines["many top-level members"] = many_members(size)
    print(f"{'line':32s} {'MiB':>5s} {'whole':>9s} {'997 B':>9s} {'128 KiB':>9s} {'peak':>9s}")
    for name, line in lines.items():
        whole = cpu_ms(partial(json_stream.judge, line))
        small = cpu_ms(partial(judged, line, 997))
        large = cpu_ms(partial(judged, line, READ))
        print(f"{name:32s} {len(line) / MiB:5.2f} {whole:6.0f} ms {small:6.0f} ms "
              f"{large:6.0f} ms {peak(partial(judged, line, READ)):5.1f} MiB")  # fmt: skip
    print("CPU milliseconds to judge each line; the most memory the validator held fed in 128 KiB")


if __name__ == "__main__":
    main()
