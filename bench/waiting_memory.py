"""Peak RSS of the bridge (VmHWM) while a client writes on behind an ``initialize`` the
agent takes its time over.

Starts ``python -m acp_bridge -- echo_agent --initialize-after S``, sends ``initialize``,
then writes ``--mib`` MiB of small ``_bench/note`` notifications from a thread. Every one
of them waits behind the ``initialize`` until the agent answers. Prints how much the
client got written and the bridge's VmHWM a second before the answer, then after all of
them went through and an echo was answered.

    python bench/waiting_memory.py [--mib 50] [--initialize-after 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time

from bridge_line_memory import AGENT, hwm_mib

NOTE = b'{"jsonrpc":"2.0","method":"_bench/note","params":{"n":1}}\n'
INITIALIZE = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
    b'"params":{"protocolVersion":1,"clientCapabilities":{}}}\n'
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=50.0)
    parser.add_argument("--initialize-after", type=float, default=3.0)
    args = parser.parse_args()
    delay = args.initialize_after
    command = [sys.executable, "-m", "acp_bridge", "--state", ":memory:", "--"]
    command += [sys.executable, str(AGENT), "--initialize-after", str(delay)]
    with tempfile.TemporaryDirectory() as home:
        bridge = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"XDG_CONFIG_HOME": home, "XDG_STATE_HOME": home, "PATH": "/usr/bin:/bin"},
        )
        assert bridge.stdin is not None and bridge.stdout is not None
        started = time.monotonic()
        bridge.stdin.write(INITIALIZE)
        bridge.stdin.flush()
        time.sleep(0.5)
        before = hwm_mib(bridge.pid)
        chunk = NOTE * ((1 << 20) // len(NOTE))
        written = 0

        def write() -> None:
            nonlocal written
            assert bridge.stdin is not None
            while written < args.mib * (1 << 20):
                bridge.stdin.write(chunk)
                written += len(chunk)
            bridge.stdin.flush()

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(max(0.0, delay - 1 - (time.monotonic() - started)))
        waiting_written, waiting = written, hwm_mib(bridge.pid)
        assert b'"id":0' in bridge.stdout.readline()
        writer.join()
        bridge.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"bench/echo","params":{}}\n')
        bridge.stdin.flush()
        assert b'"id":1' in bridge.stdout.readline()
        after = hwm_mib(bridge.pid)
        bridge.stdin.close()
        bridge.wait(timeout=30)
    print(
        f"{written / (1 << 20):.0f} MiB of notifications behind initialize: bridge peak RSS "
        f"{before:.0f} MiB before; {waiting:.0f} MiB a second before the answer "
        f"({waiting_written / (1 << 20):.1f} MiB written by then); {after:.0f} MiB after"
    )


if __name__ == "__main__":
    main()
