"""The ``acp-bridge`` command line: run (the default), check, verify, sessions, serve.

``acp-bridge [OPTIONS] -- AGENT_CMD...`` and ``acp-bridge --agent NAME`` run the bridge on
stdio. Only ACP frames are written to stdout: the real stdout is claimed at start and
fd 1 is pointed at stderr, so a stray print from any library cannot corrupt the stream.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import trio

from acp_bridge import __version__
from acp_bridge.agent_process import AgentStartError
from acp_bridge.lifecycle import Lifecycle
from acp_bridge.registry import AdapterNotFound, AdapterRegistry
from acp_bridge.relay import Bridge, BridgeOptions
from acp_bridge.sessions_cli import sessions
from acp_bridge.settings import Config, ConfigError, load_config
from acp_bridge.store import SessionStore, StoreError
from acp_bridge.trace import Tracer

log = logging.getLogger("acp_bridge")


class BridgeGroup(click.Group):
    """A group whose default command is ``run``: ``acp-bridge -- agent`` needs no verb."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["run", *args]
        elif not args:
            args = ["run"]
        return super().parse_args(ctx, args)


@dataclass(frozen=True)
class Runtime:
    """Everything a bridge run needs, resolved from options, config and presets."""

    config: Config
    options: BridgeOptions
    state: str
    registry: AdapterRegistry


def _common_options(func: Any) -> Any:
    options = [
        click.option("--agent", "agent_name", help="Run a named agent preset."),
        click.option(
            "--config", "config_file", type=click.Path(path_type=Path), help="YAML config file."
        ),
        click.option("--adapter", help="Adapter to use instead of choosing automatically."),
        click.option("--state", help="Session database path, or ':memory:'."),
        click.option("--no-override", is_flag=True, default=None, help="Never offer override."),
        click.option(
            "--on-omitted",
            type=click.Choice(["keep", "default"]),
            help="What an omitted systemPrompt on load/resume/fork means.",
        ),
        click.option(
            "--log-level",
            type=click.Choice(["debug", "info", "warning", "error"]),
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
    elif agent_cmd:
        argv = list(agent_cmd)
    else:
        raise click.UsageError("no agent: give --agent NAME or an agent command after --")
    chosen = adapter or (preset_adapter if preset_adapter not in (None, "auto") else None)
    chosen = chosen or settings.adapter
    try:
        registry = AdapterRegistry(Path(p) for p in settings.adapter_paths)
        if chosen != "auto":
            registry.get(chosen)
    except AdapterNotFound as exc:
        raise click.ClickException(str(exc)) from exc
    options = BridgeOptions(
        agent_argv=argv,
        agent_env={**env, **(extra_env or {})},
        adapter=chosen,
        on_omitted=on_omitted or settings.on_omitted,
        allow_override=not no_override and settings.allow_override,
        max_prompt_bytes=settings.max_prompt_bytes,
        line_limit=settings.line_limit,
        shutdown_grace=settings.shutdown_grace,
        agent_identity=None,
    )
    state_path = state or settings.state
    if state_path == "default":
        state_path = str(SessionStore.default_path())
    return Runtime(config, options, state_path, registry)


def open_store(path: str) -> SessionStore:
    try:
        return SessionStore(path)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc


def claim_stdout() -> int:
    """Reserve the real stdout for ACP; anything else written to fd 1 goes to stderr."""
    sys.stdout.flush()
    acp_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return acp_fd


async def run_stdio(runtime: Runtime, tracer: Tracer) -> int:
    acp_fd = claim_stdout()
    client_in = trio.lowlevel.FdStream(os.dup(0))
    client_out = trio.lowlevel.FdStream(acp_fd)
    store = open_store(runtime.state)
    try:
        lifecycle = Lifecycle(store, Path(runtime.options.agent_argv[0]).name)
        bridge = Bridge(
            runtime.options,
            client_in,
            client_out,
            lifecycle,
            registry=runtime.registry,
            tracer=tracer,
        )
        return await bridge.run()
    finally:
        store.close()


@click.group(cls=BridgeGroup)
@click.version_option(__version__, prog_name="acp-bridge")
def main() -> None:
    """A transparent ACP proxy that gives any agent the systemPrompt session capability.

    \b
    acp-bridge [OPTIONS] -- AGENT_CMD...    run an agent behind the bridge on stdio
    acp-bridge --agent NAME                 run a named preset (claude, goose, codex, ...)
    """


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
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
    """Run the bridge on stdio in front of AGENT_CMD (or --agent NAME)."""
    runtime = resolve_runtime(agent_cmd, **common)
    settings = runtime.config.bridge
    trace_path = trace_file or (Path(settings.trace) if settings.trace else None)
    tracer = Tracer(trace_path, include_prompts=trace_prompts or settings.trace_prompts)
    try:
        status = trio.run(run_stdio, runtime, tracer)
    except AgentStartError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        tracer.close()
    sys.exit(status)


main.add_command(sessions)
