"""How much the bridge costs: latency and throughput through it versus a direct connection.

    python bench/relay_bench.py [--round-trips 2000] [--notifications 50000]

Runs ``bench/echo_agent.py`` twice in the same run, once directly and once behind
``python -m acp_bridge --adapter passthrough``, drives both with the same blocking client
and prints each figure with its ratio (bridged / direct). Not a test: numbers depend on
the machine; compare them within one run. Every figure but the first is taken after the
peer has answered once, so the bridge's start-up is not counted in it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

ECHO_AGENT = Path(__file__).with_name("echo_agent.py")
MiB = 1024 * 1024


class Peer:
    """A blocking line-oriented connection to an agent process (or a bridge in front of one)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin: IO[bytes] = self.process.stdin
        self.stdout = os.fdopen(self.process.stdout.fileno(), "rb", 1 << 20, closefd=False)
        self.next_id = 0

    def request_line(self, method: str, params: bytes) -> bytes:
        self.next_id += 1
        return b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":%s}\n' % (
            self.next_id,
            method.encode(),
            params,
        )

    def call(self, method: str, params: bytes = b"{}") -> bytes:
        self.stdin.write(self.request_line(method, params))
        return self.stdout.readline()

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=30)


def first_answer(peer: Peer) -> float:
    peer.call("bench/echo")
    return (time.perf_counter() - peer.started) * 1000


def latency(peer: Peer, round_trips: int) -> list[float]:
    params = b'{"sessionId":"s","prompt":[{"type":"text","text":"hello"}]}'
    for _ in range(50):  # warm up
        peer.call("bench/echo", params)
    samples = []
    for _ in range(round_trips):
        start = time.perf_counter_ns()
        peer.call("bench/echo", params)
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def notifications_to_agent(peer: Peer, count: int) -> float:
    note = b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s","_meta":{}}}\n'
    peer.call("bench/count")  # up and running; counting starts from zero
    start = time.perf_counter()
    peer.stdin.write(note * count)
    answer = json.loads(peer.call("bench/count"))
    elapsed = time.perf_counter() - start
    assert answer["result"] == count, answer
    return count / elapsed


def notifications_to_client(peer: Peer, count: int) -> float:
    peer.call("bench/echo")  # up and running
    start = time.perf_counter()
    peer.stdin.write(peer.request_line("bench/flood", b'{"count":%d}' % count))
    for _ in range(count + 1):
        peer.stdout.readline()
    return (count + 1) / (time.perf_counter() - start)


def large_frames(peer: Peer, size: int, frames: int) -> float:
    params = b'{"blob":"' + b"x" * size + b'"}'
    peer.call("bench/echo", params)  # warm up
    start = time.perf_counter()
    for _ in range(frames):
        answer = peer.call("bench/echo", params)
        assert len(answer) > size
    return 2 * frames * len(params) / MiB / (time.perf_counter() - start)


Measure = Callable[[Peer], "float | list[float]"]


def run(argv: list[str], env: dict[str, str], measure: Measure) -> float | list[float]:
    peer = Peer(argv, env)
    try:
        return measure(peer)
    finally:
        peer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--notifications", type=int, default=50_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "XDG_CONFIG_HOME": home, "XDG_STATE_HOME": home}
        agent = [sys.executable, str(ECHO_AGENT)]
        bridged = [sys.executable, "-m", "acp_bridge", "--state", ":memory:",
                   "--adapter", "passthrough", "--log-level", "error", "--", *agent]  # fmt: skip
        paths = {"direct": agent, "bridge": bridged}

        def both(measure: Measure) -> dict[str, float | list[float]]:
            return {name: run(argv, env, measure) for name, argv in paths.items()}

        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        start = both(first_answer)
        d, b = float(start["direct"]), float(start["bridge"])  # type: ignore[arg-type]
        print(f"start to first answer: direct {d:8.1f} ms   bridge {b:8.1f} ms   "
              f"ratio {b / d:.2f}x")  # fmt: skip
        lat = both(lambda p: latency(p, args.round_trips))
        direct, bridge = sorted(lat["direct"]), sorted(lat["bridge"])  # type: ignore[arg-type]
        p99 = int(len(direct) * 0.99)
        d_med, b_med = statistics.median(direct), statistics.median(bridge)
        print(f"round trip ({args.round_trips}x, small request/response):")
        print(f"  direct  median {d_med:8.1f} us   p99 {direct[p99]:8.1f} us")
        print(f"  bridge  median {b_med:8.1f} us   p99 {bridge[p99]:8.1f} us")
        print(f"  added by the bridge: median {b_med - d_med:.1f} us, p99 "
              f"{bridge[p99] - direct[p99]:.1f} us   ratio {b_med / d_med:.2f}x")  # fmt: skip

        rows = [
            ("notifications client->agent", "msgs/s",
             lambda p: notifications_to_agent(p, args.notifications)),
            ("notifications agent->client", "msgs/s",
             lambda p: notifications_to_client(p, args.notifications)),
            ("1 MiB frames echoed (x64)", "MiB/s", lambda p: large_frames(p, MiB, 64)),
            ("16 MiB frames echoed (x8)", "MiB/s", lambda p: large_frames(p, 16 * MiB, 8)),
        ]  # fmt: skip
        for label, unit, measure in rows:
            result = both(measure)
            d, b = float(result["direct"]), float(result["bridge"])  # type: ignore[arg-type]
            print(f"{label}: direct {d:12,.0f} {unit}   bridge {b:12,.0f} {unit}   "
                  f"ratio {b / d:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
