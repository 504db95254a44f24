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

Descendants that left the group (a child that called ``setsid``, as codex-acp's shell
snapshot does) are found by walking the process tree down from the group's leader while
it still stands, and are signalled with the group. This module is also where the bridge
itself finds them (:func:`outside_group`), so both use one definition.

``PR_SET_PDEATHSIG`` alone is not enough: it covers only the direct child, not the
grandchildren behind ``npx`` or a shell, and it fires when the *thread* that forked the
child exits, which under trio is a worker thread that retires after 10 s of idleness.

Run as a script (``python -I -S agent_watchdog.py PGID GRACE [FILE...]``) with the pipe as
stdin: standard library only, so it starts in milliseconds without the bridge's packages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

POLL = 0.02

# pid -> start time, so that a pid the kernel gave to another process is never signalled.
Processes = dict[int, bytes]


def process_table() -> dict[int, tuple[int, int, bytes, bytes]]:
    """pid -> (ppid, pgrp, state, start time) of every process, from /proc (empty without)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            table[int(name)] = (int(fields[1]), int(fields[2]), fields[0], fields[19])
        except (OSError, IndexError, ValueError):
            continue
    return table


def outside_group(root: int, pgid: int) -> Processes:
    """The running descendants of ``root`` that are not in process group ``pgid``."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = {}
    pending = list(children.get(root, []))
    while pending:
        pid = pending.pop()
        _, pgrp, state, started = table[pid]
        if pgrp != pgid and state != b"Z":
            found[pid] = started
        pending.extend(children.get(pid, []))
    return found


def _same(pid: int, started: bytes) -> bool:
    """Whether ``pid`` still is the process that started at ``started``, and runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[19] == started and fields[0] != b"Z"


def signal_processes(processes: Processes, signum: int) -> None:
    for pid, started in processes.items():
        if _same(pid, started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


def any_running(processes: Processes) -> bool:
    return any(_same(pid, started) for pid, started in processes.items())


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_group(pgid: int, grace: float) -> None:
    escaped = outside_group(pgid, pgid)  # the leader's pid is the group's id
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    signal_processes(escaped, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (group_alive(pgid) or any_running(escaped)) and time.monotonic() < deadline:
        time.sleep(POLL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    signal_processes(escaped, signal.SIGKILL)


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
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
