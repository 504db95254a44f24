"""Starting the agent before the bridge itself has loaded: standard library only.

An editor that launches ``acp-bridge -- AGENT_CMD…`` waits for the agent's first answer.
The agent's own start-up (a second for claude-agent-acp) can hide the bridge's: so when
the command line names the agent command and nothing that changes how it is started, the
process is started here, before trio, click, pydantic and the adapters are imported; the
run command adopts it (:func:`take`). Any other command line is left to the usual path.

When, in addition, nothing the answer to ``initialize`` depends on needs the full bridge
(no configuration file, a built-in adapter or ``auto``), that exchange is done here too
(:mod:`acp_bridge.runtime.early_initialize`), and the runtime replays it (:func:`take_exchange`).
"""

from __future__ import annotations

import atexit
import contextlib
import os

# The number ``signal`` names, without the ``enum`` it builds to name it.
from _signal import SIGKILL  # type: ignore[import-not-found]

from acp_bridge import builtin_adapters
from acp_bridge.config_file import default_config_file
from acp_bridge.runtime import early_signals
from acp_bridge.supervision import spawn
from acp_bridge.supervision.agent_watchdog import Watchdog

# Read by type checkers only: nothing before the agent's spawn imports ``typing``, which
# costs a few milliseconds there (nor ``subprocess``: :mod:`acp_bridge.supervision.spawn`).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final

    from acp_bridge.runtime.early_initialize import Exchange

# The values the run command accepts for these options (cli.py uses the same tuples).
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
ON_OMITTED: Final = ("keep", "default")

# Options of the run command that do not change how the agent is started, with whether
# they take a value. --agent is not here: a preset names its own command. --adapter is
# neutral only when it names a built-in adapter (:func:`early_options`): a mistyped one
# must be refused before anything starts.
NEUTRAL_OPTIONS: Final = {
    "--adapter": True,
    "--state": True,
    "--config": True,
    "--trace": True,
    "--log-level": True,
    "--on-omitted": True,
    "--trace-prompts": False,
    "--no-override": False,
}


class Started:
    """An agent started early, and the watchdog it was started under."""

    __slots__ = ("process", "watchdog")

    def __init__(self, process: spawn.Child, watchdog: Watchdog) -> None:
        self.process = process
        self.watchdog = watchdog


# The process started early, under its command; taken (once) by the run command.
_STARTED: dict[tuple[str, ...], Started] = {}


def early_options(args: Sequence[str]) -> tuple[list[str], dict[str, str | None]] | None:
    """The agent command of ``[OPTIONS] -- AGENT_CMD…`` and its options (name -> value,
    ``None`` for a flag), if they are all neutral."""
    options: dict[str, str | None] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            rest = list(args[index + 1 :])
            return (rest, options) if rest else None
        name, equals, value = arg.partition("=")
        if name not in NEUTRAL_OPTIONS:
            return None
        if not NEUTRAL_OPTIONS[name]:
            if equals:
                return None  # a flag given a value: the usual path refuses it
            options[name] = None
            index += 1
            continue
        if not equals:
            if index + 1 >= len(args):
                return None
            value = args[index + 1]
        options[name] = value
        index += 1 if equals else 2
    return None


def agent_command(args: Sequence[str]) -> list[str] | None:
    """The agent command of ``[OPTIONS] -- AGENT_CMD…`` with neutral options only."""
    parsed = early_options(args)
    if parsed is None:
        return None
    argv, options = parsed
    adapter = options.get("--adapter")
    if adapter is not None and adapter != "auto" and builtin_adapters.module_of(adapter) is None:
        return None  # the usual path finds it among the user's adapters, or refuses it
    return argv


def start_early(args: Sequence[str]) -> bool:
    """Start the agent now if ``args`` (the bridge's arguments) allow it; whether it did.

    It is supervised from its spawn (spec §3): its watchdog starts first and can find the
    agent by its mark until the agent's group is named to it, so a bridge killed at any
    moment after this leaves nothing behind.
    """
    argv = agent_command(args)
    if argv is None:
        return False
    # From here a signal must not find the default action: it would end the bridge
    # without stopping an agent that may already run.
    early_signals.install()
    try:
        watchdog = Watchdog.start()
    except OSError:
        return False  # the usual path tries again, and tells the client why it cannot
    try:
        # In a session of its own, so its own process group, as the usual path starts it.
        process = spawn.spawn(argv, env=watchdog.mark(os.environ))
    except (OSError, ValueError):
        watchdog.discard()
        return False  # the usual path starts it again and tells the client why it cannot
    watchdog.watch(process.pid)
    _STARTED[tuple(argv)] = Started(process, watchdog)
    # Should the bridge stop before adopting it (a usage error, say), the agent must not
    # outlive it, nor wait for its watchdog to notice.
    atexit.register(_stop_unadopted)
    return True


def _stop_unadopted() -> None:
    for started in _STARTED.values():
        with contextlib.suppress(OSError):
            os.killpg(started.process.pid, SIGKILL)
        started.process.wait()
        started.watchdog.release()
    _STARTED.clear()


def take(argv: Sequence[str]) -> Started | None:
    """The process started early for ``argv`` (once), with its watchdog, else None."""
    return _STARTED.pop(tuple(argv), None)


def started_early(argv: Sequence[str]) -> bool:
    """Whether a process was started early for ``argv`` and not taken yet."""
    return tuple(argv) in _STARTED


# The initialize exchange done before the runtime loaded, for the runtime to replay.
_EXCHANGED: list[Exchange] = []


def take_exchange() -> Exchange | None:
    """The exchange done early (once), else None."""
    return _EXCHANGED.pop() if _EXCHANGED else None


def exchange_early(args: Sequence[str]) -> None:
    """Answer the client's ``initialize`` now if nothing it depends on needs the full
    bridge: the agent was started early, no configuration file applies, and every option
    value is one the run command accepts (otherwise it must refuse before any answer)."""
    parsed = early_options(args)
    if parsed is None or len(_STARTED) != 1:
        return
    argv, options = parsed
    started = _STARTED.get(tuple(argv))
    process = started.process if started is not None else None
    if process is None or process.stdin is None or process.stdout is None:
        return
    if "--config" in options or os.path.exists(default_config_file()):
        return
    if options.get("--log-level", "error") not in LOG_LEVELS:
        return
    if options.get("--on-omitted", "keep") not in ON_OMITTED:
        return
    from acp_bridge.runtime import early_initialize

    _EXCHANGED.append(
        early_initialize.exchange(
            0,
            1,
            process.stdin,
            process.stdout,
            adapter=options.get("--adapter") or early_initialize.AUTO,
            allow_override="--no-override" not in options,
        )
    )
