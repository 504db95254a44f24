"""The watchdog of one agent process group: it ends the group when the bridge dies.

An editor may SIGKILL the bridge it launched; the bridge then cannot stop its agent, and
an agent that ignores stdin EOF (codex-acp, claude-agent-acp 0.23.x) would run on under
init, with its children. Each agent process group therefore gets this small process, in
a session of its own (so a signal to the bridge's group does not take it along). It
blocks reading a pipe whose only write end the bridge holds:

* one byte arrives: the bridge stopped the group itself; exit quietly;
* end of file without a byte: the bridge is gone (the kernel closed its end, whatever
  killed it). SIGTERM the group, SIGKILL what is left after a short grace, remove the
  private files the bridge named, exit.

``PR_SET_PDEATHSIG`` alone is not enough: it covers only the direct child, not the
grandchildren behind ``npx`` or a shell, and it fires when the *thread* that forked the
child exits, which under trio is a worker thread that retires after 10 s of idleness.

Run as a script (``python -I -S agent_watchdog.py PGID GRACE [FILE...]``) with the pipe as
stdin: standard library only, so it starts in milliseconds without the bridge's packages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

POLL = 0.02


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_group(pgid: int, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(POLL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    pgid, grace, files = int(argv[1]), float(argv[2]), argv[3:]
    while True:
        try:
            released = os.read(0, 1)
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries already
            continue
    if released:
        return 0
    end_group(pgid, grace)
    for path in files:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
