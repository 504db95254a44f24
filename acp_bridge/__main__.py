"""The ``acp-bridge`` command (the console entry, and ``python -m acp_bridge``).

The agent is started, and the client's ``initialize`` answered, before anything heavy is
imported where the command line allows it (:mod:`acp_bridge.commands.launch`); then the command
line proper takes over (:mod:`acp_bridge.commands.cli`). This module sits above both: the library
never imports it. It also owns the process's end (:func:`exit_now`).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys

from acp_bridge.commands import launch
from acp_bridge.supervision import agent_watchdog

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the way to the agent's start
    from typing import NoReturn


def main() -> None:
    """The ``acp-bridge`` command."""
    try:
        _command(sys.argv[1:])
    except SystemExit as end:  # every command ends so (click's standalone mode), and so
        exit_now(end.code)  # does a signal while the early exchange waits for the agent


def _command(args: list[str]) -> None:
    # Start-up builds what lives as long as the process (modules, classes, the
    # configuration): the collector frees next to nothing meanwhile, yet walked the growing
    # heap for some 25 ms of CPU. An agent started here means the run command, which turns
    # the collector on again once the relay is loaded (cli.run_stdio); any other command
    # line has it on again before the command line is read.
    gc.disable()
    started = launch.start_early(args)
    try:
        launch.exchange_early(args)
    except KeyboardInterrupt:
        # Ctrl-C while waiting for the agent: as the run command ends on it before it
        # listens for signals (the agent is stopped on the way out).
        from signal import SIGINT

        sys.exit(128 + SIGINT)
    if not started:
        gc.enable()
    from acp_bridge.commands.cli import main as cli_main

    # The name the user typed, also when started as ``python -m acp_bridge``.
    cli_main(prog_name="acp-bridge")


def exit_now(code: object) -> NoReturn:
    """End the process as ``SystemExit(code)`` would, once the command is done (its agents
    stopped, its store and trace closed, its frames written), without the interpreter's
    teardown.

    What that exit would still do is done here: the functions registered with
    :mod:`atexit` run (logging's flush, the finalizers of temporary files), stdout and
    stderr are flushed, and a code that is not a number is printed, status 1. What it did
    by chance is done on purpose: the watchdogs the process started are waited for
    (:func:`~acp_bridge.supervision.agent_watchdog.finish`). The teardown left out only
    frees what the kernel frees anyway: it walked every module and object the command had
    loaded, about 50 ms of CPU at the end of each bridge run (a fifth of the run's CPU;
    bench/README.md, "tenth run"), and in a process forked from one that had loaded them
    it also copied each page it touched. An exception other than ``SystemExit`` still
    ends the process the usual way, with its traceback.
    """
    status = 0
    if isinstance(code, int):
        status = code
    elif code is not None:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    # The watchdogs, with what they still end, go first: each runs in a session of its
    # own and would otherwise act, or exit, after the process.
    agent_watchdog.finish()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
