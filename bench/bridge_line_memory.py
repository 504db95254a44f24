"""Peak RSS of the bridge process (VmHWM) after it relayed one line just under the limit.

Starts ``python -m acp_bridge -- echo_agent``, reads the bridge's VmHWM once it is idle,
sends one ``_bench/blob`` notification of ``--mib`` MiB (forwarded untouched) followed by
a small request, waits for that request's answer, and reads VmHWM again. With ``--batch``
the line is a batch of small ``_bench/note`` notifications of about that size instead.

    python bench/bridge_line_memory.py [--mib 63] [--batch]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

AGENT = Path(__file__).with_name("echo_agent.py")


def hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=63.0)
    parser.add_argument("--batch", action="store_true", help="a batch of small members")
    args = parser.parse_args()
    size = int(args.mib * 1024 * 1024)
    with tempfile.TemporaryDirectory() as home:
        bridge = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "acp_bridge",
                "--state",
                ":memory:",
                "--",
                sys.executable,
                str(AGENT),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"XDG_CONFIG_HOME": home, "XDG_STATE_HOME": home, "PATH": "/usr/bin:/bin"},
        )
        assert bridge.stdin is not None and bridge.stdout is not None
        ping = b'{"jsonrpc":"2.0","id":1,"method":"bench/echo","params":{}}\n'
        bridge.stdin.write(ping)
        bridge.stdin.flush()
        bridge.stdout.readline()
        before = hwm_mib(bridge.pid)
        if args.batch:
            size = write_batch(bridge.stdin, size)
        else:
            write_blob(bridge.stdin, size)
        bridge.stdin.write(ping.replace(b'"id":1', b'"id":2'))
        bridge.stdin.flush()
        answer = json.loads(bridge.stdout.readline())
        assert answer["id"] == 2, answer
        after = hwm_mib(bridge.pid)
        bridge.stdin.close()
        bridge.wait(timeout=30)
    line = size / 1024 / 1024
    shape = "batch" if args.batch else "line"
    print(
        f"{shape} {line:.1f} MiB: bridge peak RSS {before:.0f} MiB before, {after:.0f} MiB after "
        f"(+{after - before:.0f} MiB = {(after - before) / line:.1f}x the line)"
    )


def write_blob(out: IO[bytes], size: int) -> None:
    head = b'{"jsonrpc":"2.0","method":"_bench/blob","params":{"data":"'
    tail = b'"}}\n'
    out.write(head)
    piece = b"a" * (1 << 20)
    remaining = size - len(head) - len(tail)
    while remaining > 0:
        out.write(piece[: min(remaining, len(piece))])
        remaining -= len(piece)
    out.write(tail)


def write_batch(out: IO[bytes], size: int) -> int:
    """Write a batch of about ``size`` bytes; its size."""
    member = b'{"jsonrpc":"2.0","method":"_bench/note","params":{"n":%d}}'
    written = 1
    out.write(b"[")
    n = 0
    while written < size - 80:
        piece = (b"," if n else b"") + member % n
        out.write(piece)
        written += len(piece)
        n += 1
    out.write(b"]\n")
    return written + 2


if __name__ == "__main__":
    main()
