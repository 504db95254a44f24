"""Finding a real agent's live processes by what their environment holds.

The end-to-end tests give each agent an environment entry of its own (a private ``HOME``,
a ``CODEX_HOME``), so the processes the bridge starts for it, and whatever those start in
turn, are the live processes whose ``/proc/<pid>/environ`` holds that entry. A zombie is
not live.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import trio


def live_processes(entry: str, *, prefix: bool = False, argv0: str | None = None) -> list[int]:
    """Pids of live processes whose environment holds ``entry`` (``NAME=value``).

    With ``prefix`` an entry that only starts with it counts too (a directory made inside
    a named one); with ``argv0`` only processes whose ``argv[0]`` ends with it count (the
    agent itself, not what it started).
    """
    wanted = entry.encode()
    program = None if argv0 is None else argv0.encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            named = any(e.startswith(wanted) for e in environ) if prefix else wanted in environ
            if not named:
                continue  # the usual case: the rest of it is not read (tests poll this)
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (proc / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if state != "Z" and (program is None or command.endswith(program)):
            found.append(int(proc.name))
    return found


def environment_values(pid: int, name: str) -> list[str]:
    """The values of ``name`` in a process's environment (none once it has gone)."""
    try:
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []
    prefix = f"{name}=".encode()
    return [e[len(prefix) :].decode() for e in entries if e.startswith(prefix)]


def named_files(pids: list[int], variable: str, inside: str = "") -> dict[int, Path]:
    """Each process's file named by ``variable`` in its environment: the value itself, or
    the path ``inside`` relative to the value's last comma-separated entry (``..`` steps
    out of it)."""
    files = {}
    for pid in pids:
        for value in environment_values(pid, variable):
            named = value.rsplit(",", 1)[-1]
            files[pid] = Path(os.path.normpath(os.path.join(named, inside)) if inside else named)
    return files


async def wait_for_spare(
    pids: Callable[[], list[int]], variable: str, inside: str = "", but: int | None = None
) -> tuple[int, Path]:
    """A process the bridge started as a spare (other than pid ``but``): named a prompt
    file (``variable``, ``inside``) that does not exist yet. Its pid and that file's path."""
    while True:
        for pid, path in named_files(pids(), variable, inside).items():
            if not path.exists() and pid != but:
                return pid, path
        await trio.sleep(0.1)
