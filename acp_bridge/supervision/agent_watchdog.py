"""The watchdog: a small process that ends an agent's process group, and removes private
files, when the bridge dies.

An editor may SIGKILL the bridge it launched; the bridge then cannot stop its agent, and
an agent that ignores stdin EOF (codex-acp, claude-agent-acp 0.23.x) would run on under
init, with its children. Each agent process group therefore gets this small process, in
a session of its own (so a signal to the bridge's group does not take it along). It
reads a pipe whose only write end the bridge holds, a record at a time (each ends with
a NUL byte):

* ``M<token>``: an agent is about to start with ``ACP_BRIDGE_WATCHDOG=<token>`` in its
  environment (:meth:`Watchdog.mark`), written before the spawn;
* ``G<pgid>``: the agent's process group to end, written as soon as the spawn returns
  (:meth:`Watchdog.watch`). Should the bridge die between its mark and this record, the
  watchdog looks once (:func:`unnamed_groups`) for an agent that has reached its
  ``exec`` (it holds the mark) and for a spawn's child that has not (it still shares the
  dead bridge's memory, which ``/proc/PID/stat`` describes: the watchdog is given that
  description on its command line, :func:`memory_signature`), and ends the group of
  each. Finding neither, it knows that no spawn began, and exits at once. So the group
  is watched from its first instant: the watchdog is started before the agent, and no
  moment exists when the agent runs and the watchdog cannot find it. (The agent does
  not name its group itself, between fork and exec: that needs a ``preexec_fn``, and
  CPython then forks the whole bridge instead of using vfork, which costs with the
  bridge's size);
* ``F<path>``: a private file or folder to remove; ``D<path>``: the bridge removed it;
* ``R``: the bridge stopped the group and removed its files itself; exit quietly;
* end of file without ``R``: the bridge is gone (the kernel closed its end, whatever
  killed it). SIGTERM the group, SIGKILL what is left after a short grace, remove the
  private files still named, exit.

At its own end the bridge does not leave that to the kernel (:func:`finish`): it closes
the pipe of each watchdog it still holds and waits for every watchdog it started to exit,
so none of them, and nothing one of them ends, outlives the bridge's process.

The same process without a group keeps a pool's private folders (``acp_bridge.pool``):
they are named to it as soon as they exist, before any prompt text is written to them.
So does ``acp-bridge verify`` its home (:mod:`acp_bridge.commands.verify`).

A process that starts agent after agent (a pool's connection) may start the next agent's
watchdog ahead of it (:meth:`Watchdog.prepare`), so that its start-up, about 20 ms of CPU,
does not run beside that agent's; :meth:`Watchdog.start` takes it while it runs. Until then
it names nothing: at the end of its pipe it exits at once, as any watchdog with nothing to
end. It is the started process's own (a fork does not take it).

Descendants that left the group (a child that called ``setsid``, as codex-acp's shell
snapshot does) are found by walking the process tree down from the group's leader while
it still stands, and are signalled with the group, together with whatever has joined a
group one of them leads since (the snapshot's login shell runs the user's profile, which
may start processes after the agent has exited). This module is also where the bridge
itself finds them (:func:`outside_group`), so both use one definition.

``PR_SET_PDEATHSIG`` alone is not enough: it covers only the direct child, not the
grandchildren behind ``npx`` or a shell, and it fires when the *thread* that forked the
child exits, which under trio is a worker thread that retires after 10 s of idleness.

Standard library only, for both ends: :mod:`acp_bridge.commands.launch` starts a watchdog before
anything heavy is imported, and the watchdog (``python -I -S -c RUN GRACE BRIDGE``, the
pipe as stdin, :data:`RUN` importing this module from the folder that holds the bridge)
starts in milliseconds without the bridge's packages. It runs this module from its cached
bytecode (as a script it was compiled from source at every start) and imports neither
``signal`` nor ``contextlib`` (``enum`` and ``functools`` with them): those were about
half of its start-up, which runs beside the agent's.
"""

# The watchdog imports no contextlib (the module docstring says why): try and except do
# what contextlib.suppress would.
# ruff: noqa: SIM105

from __future__ import annotations

import os
import sys
import time

# The numbers ``signal`` names, without the ``enum`` it builds to name them.
from _signal import SIGCONT, SIGKILL, SIGTERM  # type: ignore[import-not-found]

# Read by type checkers only: ``typing`` (with ``re``) would be most of what the watchdog
# script imports while the agent starts beside it, and comes before the agent's spawn.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import weakref
    from collections.abc import Callable, Mapping
    from typing import ClassVar, Final

    from acp_bridge.supervision.spawn import Child

POLL: Final = 0.02
# How long the group of an already dead bridge gets to handle SIGTERM.
GRACE: Final = 0.5
# How long a watchdog whose bridge died between an agent's mark and naming its group
# looks again for a process in the middle of its exec (:func:`unnamed_groups`: the
# kernel's work of a few milliseconds) ...
IN_EXEC: Final = 0.5
# ... or, where ``/proc`` does not describe processes' memory, for the mark at all.
FIND_MARKED: Final = 3.0
# Where a process's code, stack, arguments and environment lie: the fields of
# ``/proc/PID/stat`` (counted from the state, the first after the command) that a child
# between fork (or vfork) and exec shares with its parent, and that any exec replaces.
_MEMORY_FIELDS: Final = (23, 24, 25, 44, 45, 46, 47, 48)
# The environment entry that marks an agent (see ``M`` above).
MARK_VARIABLE: Final = "ACP_BRIDGE_WATCHDOG"
# The folder that holds the bridge's package, and the watchdog's program: this module's
# ``main``, imported from there (after the standard library: nothing else in that folder,
# a site-packages, say, stands in for a module the watchdog imports).
_ROOT: Final = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN: Final = (
    f"import sys; sys.path.append({_ROOT!r}); "
    "from acp_bridge.supervision.agent_watchdog import main; sys.exit(main(sys.argv))"
)
_END: Final = b"\0"
GROUP: Final = b"G"
MARKED: Final = b"M"
OWN: Final = b"F"
DISOWN: Final = b"D"
RELEASE: Final = b"R"


class Watchdog:
    """The bridge's end of one watchdog process: the pipe it reads, and the process.

    :meth:`start` it before the agent, start the agent with the environment
    :meth:`mark` gives and in a session of its own, :meth:`watch` its pid; :meth:`release`
    it once the bridge has stopped the group and removed the files itself. Dropped
    without :meth:`release` (or :meth:`abandon`-ed), it does what it does when the
    bridge dies.
    """

    held: ClassVar[weakref.WeakSet[Watchdog] | None] = None
    """Watchdogs started, neither told to exit nor dropped yet (made with the first)."""

    def __init__(self, process: Child, pipe: int) -> None:
        self.process = process
        self._pipe: int | None = pipe

    @classmethod
    def start(cls, grace: float = GRACE) -> Watchdog:
        """A watchdog that names nothing yet: the one :meth:`prepare` started, while it
        runs, else a new one. Raises OSError if it cannot start."""
        return _take_ready(grace) or cls._spawn(grace)

    @classmethod
    def prepare(cls, grace: float = GRACE) -> None:
        """Start the next :meth:`start`'s watchdog now, unless one is ready: a process that
        starts agent after agent (a pool's) then starts each without a watchdog's start-up
        running beside the agent's. Idle, it names nothing: at the bridge's end, or its
        death, it exits at once. Raises OSError if it cannot start."""
        _ready[grace] = (os.getpid(), _take_ready(grace) or cls._spawn(grace))

    @classmethod
    def cancel_prepared(cls, grace: float = GRACE) -> None:
        """End the watchdog :meth:`prepare` started, if no start has taken it."""
        ready = _ready.pop(grace, None)
        if ready is not None:
            ready[1]._drop_ready(ready[0])

    def _drop_ready(self, owner: int) -> None:
        """A ready watchdog that cannot be used: it exited, or this process is a fork of
        its owner (whose end of the pipe stays open; this copy is closed)."""
        if owner == os.getpid():
            self.abandon()
            return
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            try:
                os.close(pipe)
            except OSError:
                pass

    @classmethod
    def _spawn(cls, grace: float) -> Watchdog:
        import weakref

        from acp_bridge.supervision import spawn

        _reap_ended()
        read_end, write_end = os.pipe()  # both close-on-exec: no other child inherits them
        try:
            # In a session of its own: a signal to the bridge's process group must not
            # take it along.
            process = spawn.spawn(
                [sys.executable, "-I", "-S", "-c", RUN, str(grace), _bridge()],
                stdin=read_end,
                stdout=spawn.DEVNULL,
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        watchdog = cls(process, write_end)
        if Watchdog.held is None:
            Watchdog.held = weakref.WeakSet()
        Watchdog.held.add(watchdog)
        return watchdog

    def mark(self, environment: Mapping[str, str]) -> dict[str, str]:
        """``environment`` with a mark of this watchdog's: the agent's environment. Mark
        the agent before its spawn and :meth:`watch` it after: should the bridge die in
        between, the watchdog finds it by the mark."""
        token = os.urandom(8).hex()
        self._send(MARKED + token.encode())
        return {**environment, MARK_VARIABLE: token}

    def watch(self, pid: int) -> None:
        """The agent ``pid`` was started, leading a group of its own: end that group
        should the bridge die."""
        self._send(GROUP + str(pid).encode())

    def _send(self, record: bytes) -> None:
        # One write of at most PIPE_BUF bytes is atomic; the watchdog reads at once, so
        # a write never waits. A watchdog that died leaves nothing to tell.
        if self._pipe is not None:
            try:
                os.write(self._pipe, record + _END)
            except OSError:
                pass

    def own(self, path: str) -> None:
        """Remove ``path`` (a file or a folder) should the bridge die."""
        self._send(OWN + os.fsencode(path))

    def disown(self, path: str) -> None:
        """``path`` was removed by the bridge: forget it."""
        self._send(DISOWN + os.fsencode(path))

    def release(self) -> None:
        """The bridge has done the watchdog's work itself: it exits at once, and is reaped
        later (by the next :meth:`start`), so that stopping an agent does not wait for it."""
        self._send(RELEASE)
        self.abandon()
        _reap_ended()

    def discard(self) -> None:
        """End a watchdog that has nothing to watch (the agent could not start) at once."""
        self.abandon()
        try:
            self.process.kill()
        except OSError:
            pass
        self.process.wait()

    def abandon(self) -> None:
        """Close the bridge's end: the watchdog acts as if the bridge had died."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            os.close(pipe)
            _ending.append(self.process)
        if Watchdog.held is not None:
            Watchdog.held.discard(self)

    def __del__(self) -> None:
        pipe = getattr(self, "_pipe", None)
        if pipe is not None:
            try:
                os.close(pipe)
            except OSError:
                pass
            _ending.append(self.process)


# Watchdogs told to exit, or whose pipe was closed, and not reaped yet: each start or
# release reaps those that have exited, so a long-running server does not collect zombies.
_ending: list[Child] = []
# The watchdog :meth:`Watchdog.prepare` started for the next start, by grace, with the pid
# of the process that started it.
_ready: dict[float, tuple[int, Watchdog]] = {}


def _take_ready(grace: float) -> Watchdog | None:
    """The watchdog :meth:`Watchdog.prepare` started for ``grace``, taken out, if this
    process started it and it runs; one that cannot be used is dropped."""
    ready = _ready.pop(grace, None)
    if ready is None:
        return None
    owner, watchdog = ready
    if owner == os.getpid() and watchdog.process.poll() is None:
        return watchdog
    watchdog._drop_ready(owner)
    return None


def _reap_ended() -> None:
    _ending[:] = [watchdog for watchdog in _ending if watchdog.poll() is None]


def finish(timeout: float = GRACE + 1.0) -> None:
    """At the end of the process that started them: each watchdog still held acts now, as
    it would once the process had ended (its pipe is closed), and the process waits, at
    most ``timeout`` seconds, for every watchdog it started to exit. A watchdog that acts
    exits once the group it ends is gone, so neither it nor an agent outlives the process
    (the bridge's end: :func:`acp_bridge.__main__.exit_now`)."""
    _ready.clear()  # held too: abandoned below, and they exit at once
    for watchdog in list(Watchdog.held or ()):
        watchdog.abandon()
    deadline = time.monotonic() + timeout
    for process in _ending:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            pass
    _reap_ended()


# pid -> start time, so that a pid the kernel gave to another process is never signalled.
Processes = dict[int, bytes]


def process_table() -> dict[int, tuple[int, int, bytes, bytes]]:
    """pid -> (ppid, pgrp, state, start time) of every process, from /proc (empty without)."""
    table = {}
    for pid, fields in _stats().items():
        try:
            table[pid] = (int(fields[1]), int(fields[2]), fields[0], fields[19])
        except (IndexError, ValueError):
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
    fields = _stat(pid)
    return fields is not None and fields[19:20] == [started] and fields[0] != b"Z"


def _with_their_groups(processes: Processes) -> Processes:
    """``processes`` that still run, and the running members of each group one of them
    led (a ``setsid`` shell whose profile starts more processes after it was found):
    only members started since the leader, so a reused group id is never signalled."""
    if not processes:
        return {}  # nothing escaped: no need to read every process's stat
    table = process_table()
    found = {pid: started for pid, started in processes.items() if _same(pid, started)}
    for pid, (_, pgrp, state, started) in table.items():
        leader = processes.get(pgrp)
        if leader is not None and state != b"Z" and int(started) >= int(leader):
            found[pid] = started
    return found


def signal_processes(processes: Processes, signum: int) -> None:
    for pid, started in _with_their_groups(processes).items():
        if _same(pid, started):
            _signal_quietly(os.kill, pid, signum)


def any_running(processes: Processes) -> bool:
    return bool(_with_their_groups(processes))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_quietly(send: Callable[[int, int], None], target: int, signum: int) -> None:
    """``os.kill`` or ``os.killpg`` to what may be gone already, or no longer ours."""
    try:
        send(target, signum)
    except (ProcessLookupError, PermissionError):
        pass


def end_group(pgid: int, grace: float) -> None:
    escaped = outside_group(pgid, pgid)  # the leader's pid is the group's id
    _signal_quietly(os.killpg, pgid, SIGTERM)
    signal_processes(escaped, SIGTERM)
    # A stopped process acts on the SIGTERM only once continued.
    _signal_quietly(os.killpg, pgid, SIGCONT)
    signal_processes(escaped, SIGCONT)
    deadline = time.monotonic() + grace
    while (group_alive(pgid) or any_running(escaped)) and time.monotonic() < deadline:
        time.sleep(POLL)
    _signal_quietly(os.killpg, pgid, SIGKILL)
    signal_processes(escaped, SIGKILL)


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stats() -> dict[int, list[bytes]]:
    """pid -> :func:`_stat` of every process (empty without ``/proc``)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    return {int(name): fields for name in names if name.isdigit() and (fields := _stat(name))}


def memory_signature(fields: list[bytes]) -> bytes:
    """Where the memory of the process with these stat ``fields`` lies (all ``0`` for a
    process that has let go of its memory: a dying one, a zombie, a kernel thread)."""
    try:
        return b",".join(fields[index] for index in _MEMORY_FIELDS)
    except IndexError:
        return b""


def _bridge() -> str:
    """This process, as its watchdogs are told: ``PID:SIGNATURE``, the signature empty
    where ``/proc`` does not show it."""
    fields = _stat("self")
    signature = memory_signature(fields) if fields is not None else b""
    if not signature.strip(b"0,"):
        signature = b""
    return f"{os.getpid()}:{signature.decode()}"


def unnamed_groups(
    entries: list[bytes], bridge: int, signature: bytes, since: int
) -> tuple[list[int], bool]:
    """The process groups a dead bridge (pid ``bridge``, memory ``signature``) may have
    started without naming them: those of the processes whose environment holds one of
    ``entries`` (``NAME=value``), and those of its spawns' children that have not reached
    their ``exec`` yet; and whether a process started since ``since`` (clock ticks after
    boot) may be in the middle of its exec (neither yet: look again).

    A spawn's child before its exec shares the bridge's memory, and leads a session of
    its own by the time it has closed the bridge's descriptors (its pipe to this
    watchdog with them): it is told from the bridge's other relatives by its session,
    its start (after this watchdog's) and its parent, which no longer shares that memory
    (the bridge let go of it before its descriptors closed; a live process forked from
    the same program, such as a sibling's spawn, has a parent that still does).
    """
    table = {pid: fields for pid, fields in _stats().items() if fields[0] != b"Z"}
    groups = set()
    unsure = False
    for pid, fields in table.items():  # each one's stat was read before its environment
        try:
            session, started = int(fields[3]), int(fields[19])
        except (IndexError, ValueError):
            continue
        leader = session == pid and started >= since and pid != bridge
        if leader and signature and memory_signature(fields) == signature:
            parent = table.get(int(fields[1]))
            if parent is None or memory_signature(parent) != signature:
                groups.add(pid)
                continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                held = environ.read().split(b"\0")
            if any(entry in held for entry in entries):
                groups.add(os.getpgid(pid))
            elif held == [b""] and leader:
                unsure = True
        except OSError:  # gone, or another user's
            continue
    return sorted(groups), unsure


def _find_unnamed(entries: list[bytes], bridge: str) -> list[int]:
    """:func:`unnamed_groups`, looking again while a process may be in the middle of its
    exec (for at most :data:`IN_EXEC`). Without the bridge's memory signature (``bridge``
    as :func:`_bridge` wrote it), it looks for the mark until one is found or
    :data:`FIND_MARKED` is over."""
    pid, _, signature = bridge.partition(":")
    own = _stat("self")
    since = int(own[19]) if own is not None else 0
    deadline = time.monotonic() + (IN_EXEC if signature else FIND_MARKED)
    found: set[int] = set()
    while True:
        groups, unsure = unnamed_groups(entries, int(pid or 0), signature.encode(), since)
        found.update(groups)
        done = not unsure if signature else bool(found)
        if done or time.monotonic() >= deadline:
            return sorted(found)
        time.sleep(POLL)


def _remove(path: bytes) -> None:
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def main(argv: list[str]) -> int:
    grace = float(argv[1])
    bridge = argv[2] if len(argv) > 2 else ":"
    groups: list[int] = []
    marks: list[bytes] = []
    owned: dict[bytes, None] = {}  # in the order named
    pending = b""
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        *records, pending = (pending + chunk).split(_END)
        for record in records:
            kind, value = record[:1], record[1:]
            if kind == RELEASE:
                return 0
            if kind == GROUP:
                groups.append(int(value))
            elif kind == MARKED:
                marks.append(MARK_VARIABLE.encode() + b"=" + value)
            elif kind == OWN:
                owned[value] = None
            elif kind == DISOWN:
                owned.pop(value, None)
    if len(groups) < len(marks):  # the bridge died between a mark and its group's name
        groups += _find_unnamed(marks, bridge)
    for pgid in groups:
        end_group(pgid, grace)
    for path in owned:
        _remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
