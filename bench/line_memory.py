"""Peak memory one long line costs on its way through framing and parsing.

A frame just under the line limit (64 MiB by default) is fed to a ``LineSplitter`` in
64 KiB reads, as the relay does, and the completed line is parsed with
``jsonrpc.parse``. The peak RSS of a fresh process (``ru_maxrss``) is printed with the
baseline before the line arrived, so the difference is what the line cost.

    python bench/line_memory.py [--mib 63] [--text ascii|utf8] [--stage split|parse]
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys

from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import Line, LineSplitter

READ_CHUNK = 64 * 1024


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=63.0)
    parser.add_argument("--text", choices=["ascii", "utf8"], default="ascii")
    parser.add_argument("--stage", choices=["split", "parse"], default="parse")
    args = parser.parse_args()
    size = int(args.mib * 1024 * 1024)
    head = b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"data":"'
    tail = b'"}}\n'
    unit = "é".encode() if args.text == "utf8" else b"a"
    piece = unit * (READ_CHUNK // len(unit))
    count = (size - len(head) - len(tail)) // len(piece)
    gc.collect()
    # The reads are made one at a time, as from a pipe: only what the bridge keeps counts.
    baseline = peak_mib()
    splitter = LineSplitter()
    lines = splitter.feed(head)
    for _ in range(count):
        lines += splitter.feed(bytes(bytearray(piece)))  # a new buffer per read, as a pipe gives
    lines += splitter.feed(tail)
    (line,) = lines
    assert isinstance(line, Line)
    if args.stage == "parse":
        frame = jsonrpc.parse(line.data)
        assert frame.method == "session/prompt"
    line_mib = len(line.data) / 1024 / 1024
    cost = peak_mib() - baseline
    print(
        f"{args.text} line of {line_mib:.0f} MiB, {args.stage}: peak RSS {peak_mib():.0f} MiB, "
        f"baseline {baseline:.0f} MiB, cost {cost:.0f} MiB = {cost / line_mib:.1f}x the line"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
