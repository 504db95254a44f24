"""``acp-bridge verify``: prove end to end that the system prompt reaches the model.

It runs the real agent behind an in-process bridge, points it at the embedded model
endpoint, and walks each advertised ``mode`` through the lifecycle steps (new, load after
close, resume with the prompt omitted, a changed prompt, fork, and an omitted prompt under
``on_omitted: default``). After each step it sends one ``session/prompt`` and reads the
system slot of the model call that prompt caused: the step's marker must be there (or
gone), and the agent's default prompt kept (append) or gone (override).

The agent's default prompt is learnt from a baseline session with no prompt at all, so
nothing here is specific to one agent or flavour: a preset only says how to point the
agent at the endpoint (``verify:`` in the configuration). Bridge restarts between steps
share one temporary state file, as an editor restart would.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import click
import trio

from acp_bridge import capabilities
from acp_bridge.client import AcpClient, ClientRequestError, ConnectionLost
from acp_bridge.embedded import open_embedded_bridge
from acp_bridge.jsonrpc import JsonObject
from acp_bridge.model_endpoint import ModelEndpoint, RecordedRequest, open_model_endpoint
from acp_bridge.registry import AdapterNotFound, AdapterRegistry
from acp_bridge.relay import BridgeOptions
from acp_bridge.settings import ConfigError, expand
from acp_bridge.store import SessionStore
from acp_bridge.system_prompt import SystemPrompt

Flavour = Literal["anthropic", "openai-chat", "openai-responses", "gemini"]
FLAVOURS: Final = ("anthropic", "openai-chat", "openai-responses", "gemini")

# Starting an agent may include `npx` downloading it on first use.
START_TIMEOUT: Final = 600.0
# One lifecycle request or one prompt turn against an endpoint that answers at once.
STEP_TIMEOUT: Final = 120.0
# Lines of the baseline system prompt this short are too generic to identify it.
MIN_SIGNATURE_LINE: Final = 20
# Share of the default prompt's lines that must remain (append) or may remain (override).
# Override still leaves a few fixed lines (identity, billing header) in some agents.
KEPT_AT_LEAST: Final = 0.7
GONE_AT_MOST: Final = 0.3

# LIMIT: the adapter documents that this step cannot reach the model (RFD: SHOULD apply).
Status = Literal["PASS", "FAIL", "SKIP", "LIMIT"]


@dataclass
class Row:
    step: str
    mode: str
    expectation: str
    observed: str = ""
    status: Status = "FAIL"


@dataclass
class DefaultPrompt:
    """The agent's own system prompt, as seen by the baseline session."""

    lines: list[str] = field(default_factory=list)

    @classmethod
    def from_text(cls, text: str) -> DefaultPrompt:
        seen: dict[str, None] = {}
        for line in text.splitlines():
            stripped = line.strip()
            if len(stripped) >= MIN_SIGNATURE_LINE:
                seen.setdefault(stripped)
        return cls(list(seen))

    def share_in(self, text: str) -> float:
        if not self.lines:
            return 0.0
        return sum(1 for line in self.lines if line in text) / len(self.lines)


@dataclass(frozen=True)
class Expect:
    """What one step's model call must show."""

    present: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    default: Literal["kept", "gone"] = "kept"

    def describe(self, names: dict[str, str]) -> str:
        parts = [f"{names[m]} present" for m in self.present]
        parts += [f"{names[m]} absent" for m in self.absent]
        parts.append(f"default {self.default}")
        return ", ".join(parts)


@dataclass
class VerifyPlan:
    """Everything a run needs, resolved by the command line."""

    options: BridgeOptions
    registry: AdapterRegistry
    flavour: Flavour
    home: Path
    state: str


_STARTED = time.monotonic()


def progress(message: str) -> None:
    click.echo(f"verify [{time.monotonic() - _STARTED:6.1f}s] {message}", err=True)


# ------------------------------------------------------------------------------------
# Talking to the bridge


@asynccontextmanager
async def running_bridge(
    plan: VerifyPlan, on_omitted: str
) -> AsyncIterator[tuple[AcpClient, JsonObject]]:
    """An in-process bridge in front of a fresh agent process; yields the client and the
    ``initialize`` result the bridge advertised."""
    options = dataclasses.replace(plan.options, on_omitted=on_omitted)
    with SessionStore(plan.state) as store:
        async with open_embedded_bridge(options, store, plan.registry) as embedded:
            with trio.fail_after(START_TIMEOUT):
                initialized = await embedded.client.request("initialize", _initialize_params())
            yield embedded.client, initialized if isinstance(initialized, dict) else {}


def _initialize_params() -> JsonObject:
    return {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": False}},
        "clientInfo": {"name": "acp-bridge-verify", "version": "1"},
    }


def system_prompt(mode: str, marker: str) -> JsonObject:
    text = f"Always remember the verification code {marker}."
    return {"mode": mode, "content": [{"type": "text", "text": text}]}


@dataclass
class Agent:
    """What the agent behind the bridge offers, from the advertised ``initialize`` result."""

    modes: list[str]
    load: bool
    resume: bool
    fork: bool
    close: bool
    adapter: str

    @classmethod
    def from_initialize(cls, result: JsonObject) -> Agent:
        caps = capabilities.agent_capabilities(result)
        session = capabilities.session_capabilities(result)
        advertised = session.get("systemPrompt")
        modes: list[str] = []
        if isinstance(advertised, dict):
            modes.append("append")
            mode = advertised.get("mode")
            if isinstance(mode, dict) and isinstance(mode.get("override"), dict):
                modes.append("override")
        meta = caps.get("_meta")
        bridge_meta = meta.get(capabilities.BRIDGE_META_KEY) if isinstance(meta, dict) else None
        adapter = bridge_meta.get("adapter") if isinstance(bridge_meta, dict) else None
        return cls(
            modes=modes,
            load=caps.get("loadSession") is True,
            resume=isinstance(session.get("resume"), dict),
            fork=isinstance(session.get("fork"), dict),
            close=isinstance(session.get("close"), dict),
            adapter=str(adapter or "?"),
        )


class Session:
    """One session's requests, and what the model saw for each prompt."""

    def __init__(self, run: VerifyRun, client: AcpClient, session_id: str) -> None:
        self.run = run
        self.client = client
        self.session_id = session_id

    async def prompt(self) -> RecordedRequest:
        """Send one prompt; return the main model call it caused."""
        token = f"acp-bridge-verify-turn-{next(self.run.turns)}"
        text = f"{token}: reply with one short sentence."
        with trio.fail_after(STEP_TIMEOUT):
            await self.client.request(
                "session/prompt",
                {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]},
            )
            return await self.run.model_call(token)


# ------------------------------------------------------------------------------------
# The run


class VerifyRun:
    def __init__(self, plan: VerifyPlan, endpoint: ModelEndpoint) -> None:
        self.plan = plan
        self.endpoint = endpoint
        self.rows: list[Row] = []
        self.turns = itertools.count(1)
        self.default = DefaultPrompt()
        self.cwd = plan.home / "project"
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.run_id = uuid.uuid4().hex[:8]
        self.broken: dict[str, str] = {}

    def marker(self, mode: str, step: str) -> str:
        return f"ACPBRIDGE-{mode.upper()}-{step.upper()}-{self.run_id}"

    async def model_call(self, token: str) -> RecordedRequest:
        """The first main model call whose user text carries ``token``."""
        while True:
            known = self.endpoint.main_requests(self.plan.flavour)
            for request in known:
                if any(token in text for text in request.user_texts()):
                    return request
            await self.endpoint.wait_for_requests(
                len(known) + 1, STEP_TIMEOUT, flavour=self.plan.flavour
            )

    def check(self, row: Row, request: RecordedRequest, expect: Expect) -> None:
        system = request.system_text()
        share = self.default.share_in(system)
        failures = [m for m in expect.present if m not in system]
        failures += [m for m in expect.absent if m in system]
        default_ok = share >= KEPT_AT_LEAST if expect.default == "kept" else share <= GONE_AT_MOST
        seen = [f"{'has' if m in system else 'no'} {m}" for m in (*expect.present, *expect.absent)]
        seen.append(f"default {share:.0%}")
        seen.append(f"{len(system)} ch")
        row.observed = "; ".join(seen)
        row.status = "PASS" if not failures and default_ok else "FAIL"

    async def step(
        self,
        step: str,
        mode: str,
        expect: Expect,
        names: dict[str, str],
        action: Any,
        *,
        limits: Sequence[str] = (),
    ) -> Session | None:
        """Run ``action`` (returns a Session), prompt it, and record a row.

        With ``limits`` (the adapter's documented reasons this step cannot fully apply),
        the call must still succeed, and the row shows what the model got as LIMIT.
        """
        row = Row(step, mode, expect.describe(names))
        if limits:
            row.expectation = "documented limit: " + "; ".join(limits)
        self.rows.append(row)
        progress(f"{step} [{mode}]")
        try:
            with trio.fail_after(STEP_TIMEOUT):
                session: Session = await action()
            request = await session.prompt()
        except (ClientRequestError, ConnectionLost, trio.TooSlowError, TimeoutError) as exc:
            row.observed = f"error: {_describe_error(exc)}"
            return None
        self.check(row, request, expect)
        if limits:
            row.status = "LIMIT"
        return session

    def limits(
        self, agent: Agent, previous: JsonObject | None, wanted: JsonObject | None
    ) -> list[str]:
        """The adapter's documented limits for reopening a session with another prompt."""
        try:
            adapter = self.plan.registry.get(agent.adapter)
        except AdapterNotFound:
            return []
        return adapter.reopen_limits(
            SystemPrompt.from_wire(previous) if previous else None,
            SystemPrompt.from_wire(wanted) if wanted else None,
        )

    def broken_methods(self, agent: Agent, initialized: JsonObject) -> dict[str, str]:
        """Methods the adapter says fail upstream in this agent version (shown as SKIP)."""
        try:
            adapter = self.plan.registry.get(agent.adapter)
        except AdapterNotFound:
            return {}
        return adapter.broken_methods(initialized)

    def no_reopen(self) -> str:
        reasons = [self.broken[m] for m in ("session/load", "session/resume") if m in self.broken]
        return "; ".join(reasons) or _NO_REOPEN

    def skip(self, step: str, mode: str, reason: str) -> None:
        self.rows.append(Row(step, mode, "-", reason, "SKIP"))
        progress(f"{step} [{mode}]: skipped ({reason})")

    def fail(self, step: str, mode: str, reason: str) -> None:
        self.rows.append(Row(step, mode, "-", reason, "FAIL"))

    async def main(self) -> None:
        plan = self.plan
        progress(f"starting {' '.join(plan.options.agent_argv)}")
        sessions: dict[str, str] = {}
        # --- bridge 1: baseline, session/new, load after close
        async with running_bridge(plan, "keep") as (client, initialized):
            agent = Agent.from_initialize(initialized)
            self.broken = self.broken_methods(agent, initialized)
            agent.load = agent.load and "session/load" not in self.broken
            agent.resume = agent.resume and "session/resume" not in self.broken
            progress(
                f"adapter {agent.adapter}; modes {', '.join(agent.modes) or 'none'}; "
                f"load={agent.load} resume={agent.resume} fork={agent.fork} close={agent.close}"
            )
            if not agent.modes:
                self.fail("initialize", "-", "the bridge does not advertise systemPrompt")
                return
            baseline = await self._baseline(client)
            if baseline is None:
                return
            for mode in agent.modes:
                session = await self._new(client, mode)
                if session is not None:
                    sessions[mode] = session.session_id
                    await self._load_after_close(client, agent, mode, session.session_id)
        if not sessions:
            return
        # --- bridge 2 (an editor restart): omitted prompt kept, changed prompt, fork
        async with running_bridge(plan, "keep") as (client, _):
            for mode, session_id in sessions.items():
                await self._reopen_kept(client, agent, mode, session_id)
                await self._reopen_changed(client, agent, mode, session_id)
                await self._fork(client, agent, mode, session_id)
        # --- bridge 3 with on_omitted=default: the marker must be gone
        async with running_bridge(plan, "default") as (client, _):
            for mode, session_id in sessions.items():
                await self._reopen_default(client, agent, mode, session_id)

    async def _baseline(self, client: AcpClient) -> Session | None:
        row = Row("baseline (no prompt)", "-", "default prompt recorded")
        self.rows.append(row)
        progress("baseline session without a prompt")
        try:
            with trio.fail_after(STEP_TIMEOUT):
                result = await client.request(
                    "session/new", {"cwd": str(self.cwd), "mcpServers": []}
                )
            session = Session(self, client, result["sessionId"])
            request = await session.prompt()
        except (ClientRequestError, ConnectionLost, trio.TooSlowError, TimeoutError) as exc:
            row.observed = f"error: {_describe_error(exc)}"
            return None
        system = request.system_text()
        self.default = DefaultPrompt.from_text(system)
        row.observed = f"{len(system)} ch, {len(self.default.lines)} identifying lines"
        row.status = "PASS" if self.default.lines else "FAIL"
        if not self.default.lines:
            row.observed += " (the agent sent no system prompt of its own)"
        return session

    def _names(self, **markers: str) -> dict[str, str]:
        return {value: name for name, value in markers.items()}

    async def _new(self, client: AcpClient, mode: str) -> Session | None:
        marker = self.marker(mode, "new")
        default: Literal["kept", "gone"] = "kept" if mode == "append" else "gone"

        async def action() -> Session:
            result = await client.request(
                "session/new",
                {
                    "cwd": str(self.cwd),
                    "mcpServers": [],
                    "systemPrompt": system_prompt(mode, marker),
                },
            )
            return Session(self, client, result["sessionId"])

        expect = Expect(present=(marker,), default=default)
        return await self.step("session/new", mode, expect, self._names(marker=marker), action)

    async def _load_after_close(
        self, client: AcpClient, agent: Agent, mode: str, session_id: str
    ) -> None:
        step = "load after close, prompt re-sent"
        if not agent.load:
            reason = self.broken.get("session/load", "the agent does not advertise loadSession")
            self.skip(step, mode, reason)
            return
        if not agent.close:
            self.skip(step, mode, "the agent does not advertise session/close")
            return
        marker = self.marker(mode, "new")

        async def action() -> Session:
            await client.request("session/close", {"sessionId": session_id})
            await client.request(
                "session/load",
                {
                    "sessionId": session_id,
                    "cwd": str(self.cwd),
                    "mcpServers": [],
                    "systemPrompt": system_prompt(mode, marker),
                },
            )
            return Session(self, client, session_id)

        expect = Expect(present=(marker,), default=_default_for(mode))
        await self.step(step, mode, expect, self._names(marker=marker), action)

    def _reopen_method(self, agent: Agent, prefer: str) -> str | None:
        order = ("resume", "load") if prefer == "resume" else ("load", "resume")
        for method in order:
            if (method == "load" and agent.load) or (method == "resume" and agent.resume):
                return f"session/{method}"
        return None

    async def _reopen(
        self, client: AcpClient, method: str, session_id: str, prompt: JsonObject | None
    ) -> Session:
        params: JsonObject = {"sessionId": session_id, "cwd": str(self.cwd), "mcpServers": []}
        if prompt is not None:
            params["systemPrompt"] = prompt
        await client.request(method, params)
        return Session(self, client, session_id)

    async def _reopen_kept(
        self, client: AcpClient, agent: Agent, mode: str, session_id: str
    ) -> None:
        method = self._reopen_method(agent, prefer="resume")
        if method is None:
            self.skip("reopen after restart, omitted (keep)", mode, self.no_reopen())
            return
        step = f"{method.split('/')[1]} after restart, omitted (keep)"
        marker = self.marker(mode, "new")
        expect = Expect(present=(marker,), default=_default_for(mode))
        await self.step(
            step,
            mode,
            expect,
            self._names(marker=marker),
            lambda: self._reopen(client, method, session_id, None),
        )

    async def _reopen_changed(
        self, client: AcpClient, agent: Agent, mode: str, session_id: str
    ) -> None:
        method = self._reopen_method(agent, prefer="load")
        if method is None:
            self.skip("reopen with a changed prompt", mode, self.no_reopen())
            return
        step = f"{method.split('/')[1]} of a live session, changed prompt"
        old, new = self.marker(mode, "new"), self.marker(mode, "changed")
        expect = Expect(present=(new,), absent=(old,), default=_default_for(mode))
        await self.step(
            step,
            mode,
            expect,
            self._names(marker=new, previous=old),
            lambda: self._reopen(client, method, session_id, system_prompt(mode, new)),
            limits=self.limits(agent, system_prompt(mode, old), system_prompt(mode, new)),
        )

    async def _fork(self, client: AcpClient, agent: Agent, mode: str, session_id: str) -> None:
        step = "fork with its own prompt"
        if not agent.fork:
            self.skip(step, mode, "the agent does not advertise session/fork")
            return
        parent, marker = self.marker(mode, "changed"), self.marker(mode, "fork")

        async def action() -> Session:
            result = await client.request(
                "session/fork",
                {
                    "sessionId": session_id,
                    "cwd": str(self.cwd),
                    "mcpServers": [],
                    "systemPrompt": system_prompt(mode, marker),
                },
            )
            return Session(self, client, result["sessionId"])

        expect = Expect(present=(marker,), absent=(parent,), default=_default_for(mode))
        await self.step(step, mode, expect, self._names(marker=marker, parent=parent), action)

    async def _reopen_default(
        self, client: AcpClient, agent: Agent, mode: str, session_id: str
    ) -> None:
        method = self._reopen_method(agent, prefer="load")
        if method is None:
            self.skip("reopen after restart, omitted (default)", mode, self.no_reopen())
            return
        step = f"{method.split('/')[1]} after restart, omitted (default)"
        old = self.marker(mode, "changed")
        expect = Expect(absent=(old,), default="kept")
        await self.step(
            step,
            mode,
            expect,
            self._names(previous=old),
            lambda: self._reopen(client, method, session_id, None),
            limits=self.limits(agent, system_prompt(mode, old), None),
        )


_NO_REOPEN: Final = "the agent advertises neither loadSession nor session/resume"


def _default_for(mode: str) -> Literal["kept", "gone"]:
    return "kept" if mode == "append" else "gone"


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return f"no answer within {STEP_TIMEOUT:.0f} s"
    return str(exc) or type(exc).__name__


def format_table(rows: Sequence[Row]) -> str:
    header = ("step", "mode", "expectation", "observed", "result")
    cells = [header, *((r.step, r.mode, r.expectation, r.observed, r.status) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for index, row in enumerate(cells):
        padded = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append("  ".join(padded).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    passed = sum(r.status == "PASS" for r in rows)
    failed = sum(r.status == "FAIL" for r in rows)
    skipped = sum(r.status == "SKIP" for r in rows)
    limited = sum(r.status == "LIMIT" for r in rows)
    lines.append("")
    summary = f"{passed} passed, {failed} failed, {skipped} skipped"
    if limited:
        summary += f", {limited} at a documented limit of the agent"
    lines.append(summary)
    return "\n".join(lines)


def succeeded(rows: Sequence[Row]) -> bool:
    return bool(rows) and all(r.status != "FAIL" for r in rows)


# ------------------------------------------------------------------------------------
# The command


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=VALUE, got {pair!r}", param_hint="--env")
        env[name] = value
    return env


def _make_plan(
    agent_cmd: tuple[str, ...],
    home: Path,
    endpoint_flavour: str | None,
    env_pairs: Sequence[str],
    common: dict[str, Any],
) -> VerifyPlan:
    # The URL is only known once the endpoint listens; presets name it ${ENDPOINT_URL},
    # so it is filled in by a placeholder now and by the real value in `bind_endpoint`.
    from acp_bridge.cli import resolve_runtime

    variables = {"ENDPOINT_URL": ENDPOINT_PLACEHOLDER, "VERIFY_HOME": str(home)}
    lookup = {**os.environ, **variables}
    state = common.pop("state", None) or str(home / "verify-state.sqlite3")
    flavour: str | None = endpoint_flavour
    extra_env: dict[str, str] = {}
    extra_args: list[str] = []
    agent_name = common.get("agent_name")
    if agent_name is None and not agent_cmd:
        common["agent_name"] = agent_name = DEFAULT_AGENT
    runtime = resolve_runtime(agent_cmd, state=state, variables=variables, **common)
    try:
        if agent_name:
            spec = runtime.config.agent(agent_name).verify
            if spec is None:
                raise click.ClickException(
                    f"the preset {agent_name!r} has no verify section: use -- AGENT_CMD "
                    "with --endpoint and --env instead"
                )
            flavour = flavour or spec.endpoint
            extra_env = spec.resolved_env(lookup)
            extra_args = spec.resolved_args(lookup)
            for folder in spec.resolved_dirs(lookup):
                folder.mkdir(parents=True, exist_ok=True)
        extra_env.update(
            {k: expand(v, lookup, f"--env {k}") for k, v in _parse_env(env_pairs).items()}
        )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    if flavour not in FLAVOURS:
        raise click.UsageError("give --endpoint " + "|".join(FLAVOURS))
    options = dataclasses.replace(
        runtime.options,
        agent_argv=[*runtime.options.agent_argv, *extra_args],
        agent_env={**runtime.options.agent_env, **extra_env},
    )
    return VerifyPlan(options, runtime.registry, flavour, home, runtime.state)  # type: ignore[arg-type]


ENDPOINT_PLACEHOLDER: Final = "http://acp-bridge-verify-endpoint.invalid"
DEFAULT_AGENT: Final = "claude"


def bind_endpoint(plan: VerifyPlan, url: str) -> VerifyPlan:
    """The plan with the endpoint's real URL in place of the placeholder."""

    def fill(value: str) -> str:
        return value.replace(ENDPOINT_PLACEHOLDER, url)

    options = dataclasses.replace(
        plan.options,
        agent_argv=[fill(a) for a in plan.options.agent_argv],
        agent_env={k: fill(v) for k, v in plan.options.agent_env.items()},
    )
    return dataclasses.replace(plan, options=options)


async def run_verify(plan: VerifyPlan) -> list[Row]:
    """Run every step against a fresh endpoint; the table rows, in order."""
    async with open_model_endpoint() as endpoint:
        bound = bind_endpoint(plan, endpoint.url)
        progress(f"model endpoint {endpoint.url} ({plan.flavour})")
        run = VerifyRun(bound, endpoint)
        try:
            await run.main()
        except (ClientRequestError, ConnectionLost, trio.TooSlowError, OSError) as exc:
            run.fail("run", "-", f"error: {_describe_error(exc)}")
        return run.rows


def command() -> click.Command:
    """The ``verify`` command; built on demand because it reuses the CLI's common options."""
    from acp_bridge.cli import _common_options

    @click.command(
        "verify",
        context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    )
    @_common_options
    @click.option(
        "--endpoint",
        "endpoint_flavour",
        type=click.Choice(FLAVOURS),
        help="API the agent speaks (taken from the preset's verify section with --agent).",
    )
    @click.option(
        "--env",
        "env_pairs",
        multiple=True,
        metavar="NAME=VALUE",
        help="Extra agent environment; ${ENDPOINT_URL} and ${VERIFY_HOME} are expanded.",
    )
    @click.option("--keep-home", is_flag=True, help="Keep the temporary home for inspection.")
    @click.argument("agent_cmd", nargs=-1, type=click.UNPROCESSED)
    def verify(
        agent_cmd: tuple[str, ...],
        endpoint_flavour: str | None,
        env_pairs: tuple[str, ...],
        keep_home: bool,
        **common: Any,
    ) -> None:
        """Prove delivery end to end against an embedded local model endpoint.

        Runs AGENT_CMD (or --agent NAME, default: claude) behind the bridge, creates
        sessions with marker prompts in every advertised mode and lifecycle step, and
        prints what the model received. Exit status 0 only if every row passes.
        """
        home = Path(tempfile.mkdtemp(prefix="acp-bridge-verify-"))
        try:
            plan = _make_plan(agent_cmd, home, endpoint_flavour, env_pairs, common)
            rows = trio.run(run_verify, plan)
        finally:
            if keep_home:
                progress(f"kept {home}")
            else:
                shutil.rmtree(home, ignore_errors=True)
        click.echo(format_table(rows))
        sys.exit(0 if succeeded(rows) else 1)

    return verify
