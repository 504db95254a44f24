"""Starting the agent before the bridge itself has loaded: standard library only.

An editor that launches ``acp-bridge -- AGENT_CMD…`` waits for the agent's first answer.
The agent's own start-up (a second for claude-agent-acp) can hide the bridge's: so when
the command line names the agent command and nothing that changes how it is started, the
process is started here, before trio, click, pydantic and the adapters are imported; the
run command adopts it (:func:`take`). Any other command line is left to the usual path.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Final

# Options of the run command that do not change how the agent is started, with whether
# they take a value. --agent and --adapter are not here: a preset names its own command,
# and a mistyped adapter must be refused before anything starts.
NEUTRAL_OPTIONS: Final = {
    "--state": True,
    "--config": True,
    "--trace": True,
    "--log-level": True,
    "--on-omitted": True,
    "--trace-prompts": False,
    "--no-override": False,
}

# The process started early, under its command; taken (once) by the run command.
_STARTED: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}


def agent_command(args: Sequence[str]) -> list[str] | None:
    """The agent command of ``[OPTIONS] -- AGENT_CMD…`` with neutral options only."""
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            rest = list(args[index + 1 :])
            return rest or None
        name = arg.split("=", 1)[0]
        if name not in NEUTRAL_OPTIONS:
            return None
        index += 2 if NEUTRAL_OPTIONS[name] and "=" not in arg else 1
    return None


def start_early(args: Sequence[str]) -> None:
    """Start the agent now if ``args`` (the bridge's arguments) allow it."""
    argv = agent_command(args)
    if argv is None:
        return
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # its own process group, as the usual path does
        )
    except (OSError, ValueError):
        return  # the usual path starts it again and tells the client why it cannot
    _STARTED[tuple(argv)] = process
    # Should the bridge stop before adopting it (a usage error, say), the agent must not
    # outlive it: nothing else knows of this process yet.
    atexit.register(_stop_unadopted)


def _stop_unadopted() -> None:
    for process in _STARTED.values():
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    _STARTED.clear()


def take(argv: Sequence[str]) -> subprocess.Popen[bytes] | None:
    """The process started early for ``argv`` (once), else None."""
    return _STARTED.pop(tuple(argv), None)


def main() -> None:
    """The ``acp-bridge`` command."""
    import sys

    start_early(sys.argv[1:])
    from acp_bridge.cli import main as cli_main

    cli_main()


if __name__ == "__main__":  # pragma: no cover
    main()
