"""How long the bridge takes to read blank lines: the time must grow with their number,
not with its square.

    python bench/blank_lines.py [--sizes 131072,262144,524288,1048576] [--rounds 3]

Starts ``python -m acp_bridge --adapter passthrough -- bench/echo_agent.py`` once, has it
answer ``initialize`` and one echo (the runtime has loaded), then for each size B:

- **client side**: writes B newlines to the bridge's stdin followed by a ``bench/echo``
  request, and times from the first byte written to the echo's answer;
- **client ' \\n'**: the same with lines of one space (B / 2 lines), which take the way
  of a line that is not JSON;
- **agent side**: sends ``bench/blank`` with ``{"bytes": B}``; the agent writes B newlines
  and then its answer, and the time is taken from the request to the answer.

A blank line gets nothing (the spec answers an empty line with silence), so the answer
arrives once the bridge has read every line before it. Printed per size: the median of
the rounds, its range, and microseconds per blank line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ECHO_AGENT = Path(__file__).with_name("echo_agent.py")
INITIALIZE = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'


class Bridge:
    def __init__(self) -> None:
        argv = [sys.executable, "-m", "acp_bridge", "--adapter", "passthrough", "--"]
        argv += [sys.executable, str(ECHO_AGENT)]
        env = {**os.environ, "XDG_STATE_HOME": os.environ.get("TMPDIR", "/tmp")}
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin = self.process.stdin
        self.stdout = os.fdopen(self.process.stdout.fileno(), "rb", 1 << 20, closefd=False)
        self.next_id = 0
        self.stdin.write(INITIALIZE)
        self.stdout.readline()
        # The bridge may answer initialize before its runtime has loaded; wait for that.
        self.request("bench/echo", b"{}")

    def request(self, method: str, params: bytes, before: bytes = b"") -> float:
        """Seconds from writing ``before`` and the request to its answer."""
        self.next_id += 1
        line = b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":%s}\n' % (
            self.next_id,
            method.encode(),
            params,
        )
        started = time.perf_counter()
        self.stdin.write(before + line)
        answer = self.stdout.readline()
        elapsed = time.perf_counter() - started
        assert b'"id":%d' % self.next_id in answer, answer[:200]
        return elapsed

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=30)


def row(name: str, size: int, times: list[float], lines: int | None = None) -> str:
    median = statistics.median(times)
    per_line = median / (lines or size) * 1e6
    return (
        f"{name:<12} {size / 1024:>7.0f} KiB  {median:7.3f} s  "
        f"({min(times):.3f}-{max(times):.3f})  {per_line:6.2f} us/line"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="131072,262144,524288,1048576")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    bridge = Bridge()
    try:
        for size in sizes:
            client = [
                bridge.request("bench/echo", b"{}", before=b"\n" * size) for _ in range(args.rounds)
            ]
            print(row("client side", size, client), flush=True)
            spaces = b" \n" * (size // 2)
            client = [
                bridge.request("bench/echo", b"{}", before=spaces) for _ in range(args.rounds)
            ]
            print(row("client ' \\n'", size, client, size // 2), flush=True)
            agent = [
                bridge.request("bench/blank", b'{"bytes":%d}' % size) for _ in range(args.rounds)
            ]
            print(row("agent side", size, agent), flush=True)
    finally:
        bridge.close()


if __name__ == "__main__":
    main()
