"""The ``acp-bridge`` command line: run (the default), check, verify, sessions, serve, connect.

``acp-bridge [OPTIONS] -- AGENT_CMD...`` and ``acp-bridge --agent NAME`` run the bridge on
stdio. Only ACP frames are written to stdout: the real stdout is claimed at start and
fd 1 is pointed at stderr, so a stray print from any library cannot corrupt the stream.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click
import trio

from acp_bridge import __version__
from acp_bridge.commands import launch
from acp_bridge.runtime import early_signals
from acp_bridge.runtime.stdio import claim_stdout
from acp_bridge.supervision.agent_process import AgentProcess, AgentStartError, widen_pipe

if TYPE_CHECKING:
    from acp_bridge.registry import AdapterRegistry
    from acp_bridge.runtime.agents import AgentHandle
    from acp_bridge.runtime.handover import Replay
    from acp_bridge.runtime.relay import BridgeOptions
    from acp_bridge.runtime.trace import Tracer
    from acp_bridge.settings import Config
    from acp_bridge.state.store import SessionStore, StoreError

# The run command imports the relay, the settings and the adapters (pydantic among them)
# inside its functions, after it has started the agent where it can: the agent's own
# start-up then hides that time.

log = logging.getLogger("acp_bridge")


# Commands whose modules are imported only when used: an editor starting the bridge
# should not pay for the model endpoint and the verify driver.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("acp_bridge.commands.verify", "command"),
    "sessions": ("acp_bridge.commands.sessions_cli", "sessions"),
}


DEFAULT_COMMAND: Final = "run"
# ctx.meta key: the default command runs without the user having named it.
IMPLICIT_DEFAULT: Final = "acp_bridge.implicit_default"
# A command's summary in --help is its help's first sentence; this only guards against a
# help text without one.
SUMMARY_LIMIT: Final = 200


class BridgeGroup(click.Group):
    """A group whose default command is ``run``: ``acp-bridge -- agent`` needs no verb.

    Its help shows the default command's options, since that is the command people run.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        known = {*self.commands, *LAZY_COMMANDS}
        if not args or (args[0] not in known and args[0] not in ("--help", "--version")):
            if args:
                refuse_mistyped_command(ctx, args, known)
            ctx.meta[IMPLICIT_DEFAULT] = True
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *LAZY_COMMANDS})

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] [--] AGENT_CMD...")
        formatter.write_usage(ctx.command_path, "COMMAND [ARGS]...", prefix="   or: ")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The default command's options (with the group's own --version and --help),
        then the commands."""
        records = []
        default = self.commands.get(DEFAULT_COMMAND)
        if default is not None:
            with click.Context(default, info_name=DEFAULT_COMMAND, parent=ctx) as run_ctx:
                own_help = default.get_help_option(run_ctx)
                records += [
                    record
                    for param in default.get_params(run_ctx)
                    if isinstance(param, click.Option)
                    and param is not own_help
                    and (record := param.get_help_record(run_ctx))
                ]
        records += [
            record for param in self.get_params(ctx) if (record := param.get_help_record(ctx))
        ]
        with formatter.section("Options"):
            formatter.write_dl(records)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command with the first sentence of its help, whole: the definition list
        wraps it, where click would cut it to one line."""
        rows = [
            (name, command.get_short_help_str(limit=SUMMARY_LIMIT))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module_name, factory = LAZY_COMMANDS[cmd_name]
            module = importlib.import_module(module_name)
            found = getattr(module, factory)
            self.add_command(found if isinstance(found, click.Command) else found(), cmd_name)
        return super().get_command(ctx, cmd_name)


def refuse_mistyped_command(ctx: click.Context, args: Sequence[str], known: set[str]) -> None:
    """A usage error for a first word close to a command's name that cannot be meant as the
    agent command: no executable of that name is on PATH, or ``--agent`` follows it.
    (After ``--`` every word is the agent command; click never sees this one then.)"""
    word = args[0]
    if word.startswith("-"):
        return
    import difflib  # here: an editor's `acp-bridge -- AGENT` never needs it
    import shutil

    close = difflib.get_close_matches(word, sorted(known), n=1)
    if not close:
        return
    with_preset = any(arg == "--agent" or arg.startswith("--agent=") for arg in args[1:])
    if shutil.which(word) is None or with_preset:
        raise click.UsageError(
            f"No such command {word!r}. Did you mean {close[0]!r}? "
            f"(An agent command of that name goes after --.)",
            ctx,
        )


class DefaultCommandContext(click.Context):
    """The context of the default command: when the user did not name it, its usage
    lines and hints show the command line as typed (``acp-bridge``, not ``acp-bridge run``)."""

    @property
    def command_path(self) -> str:
        if self.meta.get(IMPLICIT_DEFAULT) and self.parent is not None:
            return self.parent.command_path
        return super().command_path


class DefaultCommand(click.Command):
    context_class = DefaultCommandContext

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if ctx.meta.get(IMPLICIT_DEFAULT) and ctx.parent is not None:
            ctx.parent.command.format_usage(ctx.parent, formatter)
        else:
            super().format_usage(ctx, formatter)


@dataclass(frozen=True)
class Runtime:
    """Everything a bridge run needs, resolved from options, config and presets."""

    config: Config
    options: BridgeOptions
    state: str
    registry: AdapterRegistry
    variables: dict[str, str]
    install: str = ""
    """The preset's install hint, for an agent that cannot be started."""
    adapter_source: str = ""
    """Where the adapter was named, in words; empty when it is chosen automatically."""

    def start_failure(self, exc: AgentStartError) -> click.ClickException:
        """The error for an agent that cannot be started, with how to install it."""
        return click.ClickException(self.explain(str(exc)))

    def explain(self, message: str) -> str:
        """``message`` about a failed agent start, with the preset's install hint."""
        return f"{message}\nTo get it: {self.install}" if self.install else message

    async def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], private_files: Sequence[str] = ()
    ) -> AgentHandle:
        """Start an agent process; a failure names the preset's install hint, so the log
        and the client's initialize error say how to get the agent."""
        from acp_bridge.runtime.agents import spawn_process

        try:
            return await spawn_process(argv, env, private_files)
        except AgentStartError as exc:
            raise AgentStartError(exc.command, self.explain(exc.cause)) from exc


def _common_options(func: Any) -> Any:
    options = [
        click.option("--agent", "agent_name", metavar="NAME", help="Run a named agent preset."),
        click.option(
            "--config", "config_file", type=click.Path(path_type=Path), help="YAML config file."
        ),
        click.option(
            "--adapter", metavar="NAME", help="Adapter to use instead of choosing automatically."
        ),
        click.option("--state", metavar="PATH", help="Session database path, or ':memory:'."),
        click.option("--no-override", is_flag=True, default=None, help="Never offer override."),
        click.option(
            "--on-omitted",
            type=click.Choice(launch.ON_OMITTED),
            help="What an omitted systemPrompt on load/resume/fork means.",
        ),
        click.option(
            "--log-level",
            type=click.Choice(launch.LOG_LEVELS),
            help="stderr log level.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def resolve_runtime(
    agent_cmd: Sequence[str],
    *,
    agent_name: str | None,
    config_file: Path | None,
    adapter: str | None,
    state: str | None,
    no_override: bool | None,
    on_omitted: str | None,
    log_level: str | None,
    extra_env: dict[str, str] | None = None,
    variables: dict[str, str] | None = None,
) -> Runtime:
    from acp_bridge.registry import AdapterNotFound, AdapterRegistry
    from acp_bridge.runtime.relay import BridgeOptions
    from acp_bridge.settings import ConfigError, load_config, resolve_state

    try:
        config = load_config(config_file)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    settings = config.bridge
    logging.basicConfig(
        stream=sys.stderr,
        level=(log_level or settings.log_level).upper(),
        format="acp-bridge: %(levelname)s %(name)s: %(message)s",
    )
    env: dict[str, str] = {}
    preset_adapter = None
    install = ""
    lookup = {**os.environ, **(variables or {})}
    if agent_name and agent_cmd:
        raise click.UsageError("give either --agent NAME or an agent command, not both")
    if agent_name:
        try:
            preset = config.agent(agent_name)
            argv = preset.resolved_command(lookup)
            env = preset.resolved_env(lookup)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
        preset_adapter = preset.adapter
        install = preset.install
    elif agent_cmd:
        argv = list(agent_cmd)
    else:
        raise click.UsageError("no agent: give --agent NAME or an agent command after --")
    chosen = adapter or (preset_adapter if preset_adapter not in (None, "auto") else None)
    chosen = chosen or settings.adapter
    if adapter:
        adapter_source = "given with --adapter"
    elif preset_adapter not in (None, "auto"):
        adapter_source = f"named by the preset {agent_name!r}"
    elif chosen != "auto":
        adapter_source = "set by bridge.adapter in the configuration"
    else:
        adapter_source = ""
    try:
        registry = AdapterRegistry(settings.adapter_folders(lookup))
        if chosen != "auto":
            registry.get(chosen)
        state_location = resolve_state(state, lookup) if state else settings.state_location(lookup)
    except (AdapterNotFound, ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    options = BridgeOptions(
        agent_argv=argv,
        agent_env={**env, **(extra_env or {})},
        adapter=chosen,
        on_omitted=on_omitted or settings.on_omitted,
        allow_override=not no_override and settings.allow_override,
        max_prompt_bytes=settings.max_prompt_bytes,
        line_limit=settings.line_limit,
        stream_after=settings.stream_after,
        shutdown_grace=settings.shutdown_grace,
        adapter_options=settings.adapter_options,
    )
    return Runtime(config, options, str(state_location), registry, lookup, install, adapter_source)


def open_store(path: str) -> SessionStore:
    from acp_bridge.state.store import SessionStore, StoreError

    try:
        return SessionStore(path)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc


async def run_stdio(
    runtime: Runtime,
    tracer: Tracer,
    acp_fd: int | None = None,
    started: AgentHandle | None = None,
    replay: Replay | None = None,
) -> int:
    """Relay stdio to the agent; ``started``: its process, if it was started already;
    ``replay``: the initialize exchange done before the bridge loaded, if any."""
    from acp_bridge.runtime.relay import Bridge
    from acp_bridge.state.lifecycle import Lifecycle
    from acp_bridge.state.store import SessionStore, StoreError

    # What is loaded by now (modules, classes, the configuration) lives as long as the
    # process: frozen, the collector never walks it again, nor does the interpreter's
    # exit collect it (that exit took a quarter of a short bridge run's CPU). This is the
    # command's own process: the library never calls this. The collector was off while
    # the bridge loaded if the agent was started early (acp_bridge.__main__).
    gc.freeze()
    gc.enable()
    if acp_fd is None:
        acp_fd = claim_stdout()
    client_in: trio.abc.ReceiveStream = trio.lowlevel.FdStream(os.dup(0))
    client_out: trio.abc.SendStream = trio.lowlevel.FdStream(acp_fd)
    widen_pipe(0)
    widen_pipe(acp_fd)
    try:
        store = SessionStore(runtime.state)
    except StoreError as exc:
        return await refuse_without_store(
            runtime, exc, client_in, client_out, started=started, replay=replay
        )
    if replay is not None:
        client_in, client_out = replay.client(client_in, client_out)
    try:
        lifecycle = Lifecycle.for_command(store, runtime.options.agent_argv)
        bridge = Bridge(
            runtime.options,
            client_in,
            client_out,
            lifecycle,
            registry=runtime.registry,
            tracer=tracer,
            spawner=runtime.spawn,
        )
        if started is not None:
            bridge.adopt(started)
        return await bridge.run()
    finally:
        store.close()


# The exit status of a bridge whose session database cannot be used.
STORE_FAILED_STATUS: Final = 1


async def refuse_without_store(
    runtime: Runtime,
    failure: StoreError,
    client_in: trio.abc.ReceiveStream,
    client_out: trio.abc.SendStream,
    *,
    started: AgentHandle | None,
    replay: Replay | None,
) -> int:
    """The session database cannot be used: say so on stderr and to the client, whose
    requests (its ``initialize`` included, unless the early exchange answered it already)
    get an error naming the database and the cause; then exit non-zero."""
    from acp_bridge.runtime.refusal import refuse_requests
    from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, error_object

    log.error("%s", failure)
    if started is not None:
        await started.stop(runtime.options.shutdown_grace)
    exchange = replay.exchange if replay is not None else None
    unanswered = b""
    if exchange is not None:
        unanswered = exchange.client_rest
        if not exchange.answered:
            unanswered = exchange.client_first + unanswered
    error = error_object(
        INTERNAL_ERROR,
        f"The bridge cannot use its session database: {failure}",
        {"database": runtime.state},
    )
    await refuse_requests(
        client_in,
        client_out,
        error,
        line_limit=runtime.options.line_limit,
        wait=runtime.options.shutdown_grace + 3,
        already_read=unanswered,
    )
    return STORE_FAILED_STATUS


async def run_stdio_started_first(
    agent_cmd: tuple[str, ...],
    common: dict[str, Any],
    trace_file: Path | None,
    trace_prompts: bool,
    acp_fd: int,
) -> int:
    """``run`` for an agent command: start it, then load everything else meanwhile.

    How ``-- AGENT_CMD`` is started depends on nothing in the configuration (its
    environment is the bridge's own), so the agent starts before the configuration, the
    adapters and the validation models are loaded. Should the configuration then ask for
    something else, or be wrong, the process is stopped again. (With ``--adapter``, this
    path is taken only for a built-in adapter, whose name launch.py has checked.)

    If the client's ``initialize`` was answered before the bridge loaded
    (:mod:`acp_bridge.runtime.early_initialize`), the bridge replays that exchange
    (:mod:`acp_bridge.runtime.handover`).
    """
    from acp_bridge.runtime.handover import Replay

    started: AgentProcess | None
    early = launch.take(agent_cmd)
    exchange = launch.take_exchange()
    replay = Replay(exchange) if exchange is not None and early is not None else None
    try:
        if early is not None:
            started = AgentProcess.adopt(early.process, list(agent_cmd), early.watchdog)
            if replay is not None:
                replay.agent(started)
        else:
            started = await AgentProcess.start(list(agent_cmd))
    except AgentStartError:
        started = None  # the usual path fails the same way and tells the client why
    try:
        runtime = resolve_runtime(agent_cmd, **common)
        if exchange is not None:
            log.debug("initialize before the bridge loaded: %s; replaying it", exchange.stage)
        tracer = make_tracer(runtime, trace_file, trace_prompts)
    except BaseException:
        if started is not None:
            with trio.CancelScope(shield=True):
                await started.stop(0.5)
        raise
    if (
        started is not None
        and replay is None  # it has talked to the client already: it stays
        and (list(runtime.options.agent_argv) != list(agent_cmd) or runtime.options.agent_env)
    ):
        await started.stop(runtime.options.shutdown_grace)
        started = None
    try:
        return await run_stdio(runtime, tracer, acp_fd, started, replay)
    finally:
        tracer.close()


def make_tracer(runtime: Runtime, trace_file: Path | None, trace_prompts: bool) -> Tracer:
    from acp_bridge.runtime.trace import TraceFileError, Tracer
    from acp_bridge.settings import ConfigError

    settings = runtime.config.bridge
    try:
        trace_path = trace_file or settings.trace_path(runtime.variables)
        return Tracer(trace_path, include_prompts=trace_prompts or settings.trace_prompts)
    except (ConfigError, TraceFileError) as exc:
        raise click.ClickException(str(exc)) from exc


@click.group(cls=BridgeGroup)
@click.version_option(__version__, prog_name="acp-bridge")
def main() -> None:
    """A transparent ACP proxy that gives any agent the systemPrompt session capability.

    Without a COMMAND, runs the bridge on stdio in front of AGENT_CMD, or of a named
    preset with --agent NAME (claude, claude-legacy, goose, codex, codex-legacy, gemini,
    qwen, opencode, copilot, or your own).
    """


@main.command(cls=DefaultCommand, context_settings={"allow_interspersed_args": False})
@_common_options
@click.option("--trace", "trace_file", type=click.Path(path_type=Path), help="JSONL frame log.")
@click.option("--trace-prompts", is_flag=True, help="Keep system prompt text in the trace.")
@click.argument("agent_cmd", nargs=-1, type=click.UNPROCESSED)
def run(
    agent_cmd: tuple[str, ...],
    trace_file: Path | None,
    trace_prompts: bool,
    **common: Any,
) -> None:
    """The default command: run the bridge on stdio in front of AGENT_CMD (or --agent)."""
    # Before anything else runs: loading user adapters may print at import time.
    acp_fd = claim_stdout()
    runtime: Runtime | None = None
    try:
        if (
            agent_cmd
            and not common.get("agent_name")
            and (not common.get("adapter") or launch.started_early(agent_cmd))
        ):
            with early_signals.held():
                status = trio.run(
                    run_stdio_started_first, agent_cmd, common, trace_file, trace_prompts, acp_fd
                )
        else:
            runtime = resolve_runtime(agent_cmd, **common)
            tracer = make_tracer(runtime, trace_file, trace_prompts)
            try:
                with early_signals.held():
                    status = trio.run(run_stdio, runtime, tracer, acp_fd)
            finally:
                tracer.close()
    except AgentStartError as exc:
        if runtime is None:
            raise click.ClickException(str(exc)) from exc
        raise runtime.start_failure(exc) from exc
    except KeyboardInterrupt:
        # Ctrl-C before the bridge listens for signals; the agent was stopped on the way out.
        status = 128 + signal.SIGINT
    sys.exit(status)


@main.command(context_settings={"allow_interspersed_args": False})
@_common_options
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
@click.argument("agent_cmd", nargs=-1, type=click.UNPROCESSED)
def check(agent_cmd: tuple[str, ...], as_json: bool, **common: Any) -> None:
    """Initialize the agent once and show what it and the bridge advertise."""
    import json

    from acp_bridge.commands.check import report_lines, run_check
    from acp_bridge.runtime.client import ClientRequestError, ConnectionLost

    runtime = resolve_runtime(agent_cmd, **common)
    try:
        report = trio.run(run_check, runtime.options, runtime.registry, runtime.adapter_source)
    except AgentStartError as exc:
        raise runtime.start_failure(exc) from exc
    except (trio.TooSlowError, ClientRequestError, ConnectionLost) as exc:
        raise click.ClickException(f"the agent did not initialize: {exc}") from exc
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in report_lines(report):
        click.echo(line)


@main.command(context_settings={"allow_interspersed_args": False})
@_common_options
@click.option(
    "--listen",
    required=True,
    help="unix:PATH or tcp://HOST:PORT (loopback unless a token is set).",
)
@click.option(
    "--token",
    envvar="ACP_BRIDGE_TOKEN",
    help="Required of clients in initialize _meta['acp-bridge'].token. Prefer the "
    "ACP_BRIDGE_TOKEN variable or --token-file: argv is visible to every local user.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Read the token from this file (e.g. a mounted secret).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Connections (each with its own agent process) open at once.",
)
@click.argument("agent_cmd", nargs=-1, type=click.UNPROCESSED)
def serve(
    agent_cmd: tuple[str, ...],
    listen: str,
    token: str | None,
    token_file: Path | None,
    max_connections: int,
    **common: Any,
) -> None:
    """Sidecar: accept ACP connections on a socket, one agent process per connection."""
    from click.core import ParameterSource

    from acp_bridge.commands.connect import TokenError, read_token_file
    from acp_bridge.commands.serve import ListenAddress, ListenError, ServeLimits, Server
    from acp_bridge.commands.serve import serve as serve_forever

    try:
        address = ListenAddress.parse(listen)
    except ListenError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from exc
    token_from_argv = (
        click.get_current_context().get_parameter_source("token") is ParameterSource.COMMANDLINE
    )
    if token_file is not None:
        try:
            token = read_token_file(token_file)
        except TokenError as exc:
            raise click.BadParameter(str(exc), param_hint="--token-file") from exc
    if not address.loopback and not token:
        raise click.UsageError(
            f"{address} is not a loopback address: set ACP_BRIDGE_TOKEN (or --token-file)"
        )
    runtime = resolve_runtime(agent_cmd, **common)
    if token_from_argv and token_file is None:
        log.warning(
            "--token is visible to every local user in the process list; "
            "set ACP_BRIDGE_TOKEN or use --token-file instead"
        )
    store = open_store(runtime.state)
    server = Server(
        runtime.options,
        store,
        runtime.registry,
        token or None,
        ServeLimits(max_connections=max_connections),
    )

    def announce(line: str) -> None:
        # A server's start-up line, at the default log level too (as uvicorn's); the stdio
        # modes say nothing, their stderr being the editor's log.
        if log.isEnabledFor(logging.WARNING):
            click.echo(f"acp-bridge: {line}", err=True)

    try:
        trio.run(partial(serve_forever, server, address, announce=announce))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {address}: {exc}") from exc
    finally:
        store.close()


@main.command()
@click.argument("address")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Read the token from this file instead of ACP_BRIDGE_TOKEN.",
)
@click.option(
    "--log-level",
    type=click.Choice(launch.LOG_LEVELS),
    default="warning",
    help="stderr log level.",
)
def connect(address: str, token_file: Path | None, log_level: str) -> None:
    """Reach an `acp-bridge serve` sidecar on stdio: ADDRESS is unix:PATH or tcp://HOST:PORT.

    The token comes from the ACP_BRIDGE_TOKEN variable or --token-file, never from argv.
    """
    from acp_bridge.commands.connect import command

    command(address, token_file, log_level)
