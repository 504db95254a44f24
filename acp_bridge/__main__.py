"""The ``acp-bridge`` command (the console entry, and ``python -m acp_bridge``).

The agent is started, and the client's ``initialize`` answered, before anything heavy is
imported where the command line allows it (:mod:`acp_bridge.commands.launch`); then the command
line proper takes over (:mod:`acp_bridge.commands.cli`). This module sits above both: the library
never imports it.
"""

from __future__ import annotations

import gc
import signal
import sys

from acp_bridge.commands import launch


def main() -> None:
    """The ``acp-bridge`` command."""
    args = sys.argv[1:]
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
        sys.exit(128 + signal.SIGINT)
    if not started:
        gc.enable()
    from acp_bridge.commands.cli import main as cli_main

    # The name the user typed, also when started as ``python -m acp_bridge``.
    cli_main(prog_name="acp-bridge")


if __name__ == "__main__":
    main()
