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
import re
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TextIO

import click
import trio

from acp_bridge.adapter import ReopenLimit
from acp_bridge.core import capabilities
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.model_endpoint import ModelEndpoint, RecordedRequest, open_model_endpoint
from acp_bridge.registry import AdapterNotFound, AdapterRegistry
from acp_bridge.runtime.client import AcpClient, ClientRequestError, ConnectionLost
from acp_bridge.runtime.embedded import open_embedded_bridge
from acp_bridge.runtime.relay import BridgeOptions
from acp_bridge.settings import Config, ConfigError, expand
from acp_bridge.state.store import SessionStore
from acp_bridge.supervision.agent_process import AgentStartError
from acp_bridge.supervision.agent_watchdog import Watchdog
from acp_bridge.supervision.private_dirs import PrivateDir
from acp_bridge.wire.jsonrpc import JsonObject

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

# Lines of the agent's stderr shown under a failing row (all of it stays in the file).
STDERR_TAIL: Final = 20

# LIMIT: the adapter documents that this step cannot reach the model (RFD: SHOULD apply),
# and the model received exactly what the adapter says it then receives.
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


def limited_expectation(
    expect: Expect,
    limits: Sequence[ReopenLimit],
    wanted: SystemPrompt | None,
    markers: Sequence[str],
    created: SystemPrompt | None = None,
) -> Expect:
    """What the model must show for a step whose prompt hits the adapter's ``limits``.

    ``expect`` is the step's own expectation; ``markers`` are the markers of the step's
    prompts, found in a limit's prompts by their text; ``created`` is the prompt the session
    was created with. A prompt a limit says the model still receives must be present, one
    it misses must be absent, and the agent's default prompt is gone exactly when an
    override is in effect.
    """

    def marks(prompts: Sequence[SystemPrompt]) -> list[str]:
        return [m for m in markers if any(m in prompt.text for prompt in prompts)]

    received = [prompt for limit in limits for prompt in limit.receives]
    if created is not None and any(limit.receives_created for limit in limits):
        received.append(created)
    missed = [prompt for limit in limits for prompt in limit.misses]
    kept, lost = marks(received), marks(missed)
    present = [m for m in expect.present if m not in lost]
    present += [m for m in kept if m not in present]
    absent = [m for m in expect.absent if m not in kept]
    absent += [m for m in lost if m not in absent]
    in_effect = list(received)
    if wanted is not None and wanted.fingerprint() not in {p.fingerprint() for p in missed}:
        in_effect.append(wanted)
    default: Literal["kept", "gone"] = (
        "gone" if any(p.mode == "override" for p in in_effect) else "kept"
    )
    return Expect(tuple(present), tuple(absent), default)


@dataclass
class VerifyPlan:
    """Everything a run needs, resolved by the command line."""

    options: BridgeOptions
    registry: AdapterRegistry
    flavour: Flavour
    home: Path
    state: str
    install: str = ""
    """The preset's install hint, for an agent that cannot be started."""
    files: Mapping[Path, str] = field(default_factory=dict)
    """The preset's files to write before the agent starts (``${ENDPOINT_URL}`` bound)."""

    def write_files(self) -> None:
        for path, text in self.files.items():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)


_STARTED = time.monotonic()


@dataclass
class Console:
    """Where progress goes: the terminal's stderr, also while fd 2 points at the agent's
    log (``None``: whatever ``sys.stderr`` is)."""

    stream: TextIO | None = None


CONSOLE: Final = Console()


def progress(message: str) -> None:
    elapsed = time.monotonic() - _STARTED
    click.echo(f"verify [{elapsed:6.1f}s] {message}", file=CONSOLE.stream, err=True)


class AgentLog:
    """The file that holds the agent's (and the in-process bridge's) stderr during a run.

    Created private (mode 0600: the agent may log prompt text); kept after a run with a
    failing row so the user can read it; :meth:`tail` shows a failing row's share of it.
    """

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="acp-bridge-verify-", suffix=".stderr.log")
        os.close(fd)
        self.path = Path(name)

    def remove_if_empty(self) -> None:
        """Nothing to read (the agent never started, or said nothing): leave no file."""
        if self.size() == 0:
            self.path.unlink(missing_ok=True)

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def tail(self, since: int = 0, lines: int = STDERR_TAIL) -> list[str]:
        """The last ``lines`` lines written after offset ``since``."""
        try:
            with self.path.open("rb") as log_file:
                log_file.seek(since)
                text = log_file.read().decode(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]

    @contextmanager
    def capturing(self) -> Iterator[TextIO]:
        """Point fd 2 at the file (the agent inherits it; logging writes to it); yield a
        stream on the real stderr for progress, and restore fd 2 on the way out."""
        sys.stderr.flush()
        saved = os.dup(2)
        target = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, 2)
        os.close(target)
        console = os.fdopen(os.dup(saved), "w", buffering=1)
        try:
            yield console
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            console.close()


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
    def __init__(
        self,
        plan: VerifyPlan,
        endpoint: ModelEndpoint,
        agent_log: AgentLog | None = None,
        verbose: bool = False,
    ) -> None:
        self.plan = plan
        self.endpoint = endpoint
        self.agent_log = agent_log
        self.verbose = verbose
        self.rows: list[Row] = []
        self.turns = itertools.count(1)
        self.default = DefaultPrompt()
        self.cwd = plan.home / "project"
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.run_id = uuid.uuid4().hex[:8]
        # Per mode: the marker of the prompt the session runs with, as far as the model is
        # concerned (a reopen at a documented limit may leave the previous one in place).
        self.in_effect: dict[str, str] = {}
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

    def check(
        self, row: Row, request: RecordedRequest, expect: Expect, names: dict[str, str]
    ) -> None:
        system = request.system_text()
        share = self.default.share_in(system)
        failures = [m for m in expect.present if m not in system]
        failures += [m for m in expect.absent if m in system]
        default_ok = share >= KEPT_AT_LEAST if expect.default == "kept" else share <= GONE_AT_MOST
        # Markers by their role in the step, as the expectation names them.
        seen = [
            f"{'has' if m in system else 'no'} {names.get(m, m)}"
            for m in (*expect.present, *expect.absent)
        ]
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
        limits: Sequence[ReopenLimit] = (),
        wanted: JsonObject | None = None,
        created: JsonObject | None = None,
    ) -> Session | None:
        """Run ``action`` (returns a Session), prompt it, and record a row.

        With ``limits`` (the adapter's documented reasons this step cannot fully apply to
        the ``wanted`` prompt), the call must still succeed, and the row reads LIMIT when
        the model received what the limits say it then receives, FAIL otherwise.
        """
        if limits:
            expect = limited_expectation(
                expect,
                limits,
                SystemPrompt.from_wire(wanted) if wanted else None,
                list(names),
                SystemPrompt.from_wire(created) if created else None,
            )
        row = Row(step, mode, expect.describe(names))
        if limits:
            row.expectation = f"documented limit: {'; '.join(limits)}; so {row.expectation}"
        self.rows.append(row)
        progress(f"{step} [{mode}]")
        since = self.agent_log.size() if self.agent_log else 0
        try:
            try:
                with trio.fail_after(STEP_TIMEOUT):
                    session: Session = await action()
                request = await session.prompt()
            except (ClientRequestError, ConnectionLost, trio.TooSlowError, TimeoutError) as exc:
                row.observed = f"error: {_describe_error(exc)}"
                return None
            self.check(row, request, expect, names)
            if limits and row.status == "PASS":
                row.status = "LIMIT"
            return session
        finally:
            self.report(row, since)

    def report(self, row: Row, since: int) -> None:
        """Show a failing row's share of the agent's stderr (every row's with --verbose)."""
        if self.agent_log is None or not (row.status == "FAIL" or self.verbose):
            return
        if row.status == "FAIL":
            progress(f"FAIL {row.step} [{row.mode}]: {row.observed}")
        lines = self.agent_log.tail(since)
        if lines:
            progress(f"agent stderr during this step (last {len(lines)} lines):")
            for line in lines:
                click.echo(f"    {line}", file=CONSOLE.stream, err=True)

    def limits(
        self,
        agent: Agent,
        previous: JsonObject | None,
        wanted: JsonObject | None,
        *,
        fork: bool = False,
    ) -> list[ReopenLimit]:
        """The adapter's documented limits for reopening (or forking) a session with
        another prompt."""
        try:
            adapter = self.plan.registry.get(agent.adapter)
        except AdapterNotFound:
            return []
        before = SystemPrompt.from_wire(previous) if previous else None
        after = SystemPrompt.from_wire(wanted) if wanted else None
        documented = adapter.fork_limits if fork else adapter.reopen_limits
        return [ReopenLimit.of(limit, before, after) for limit in documented(before, after)]

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
                    self.in_effect[mode] = self.marker(mode, "new")
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
        since = self.agent_log.size() if self.agent_log else 0
        try:
            with trio.fail_after(STEP_TIMEOUT):
                result = await client.request(
                    "session/new", {"cwd": str(self.cwd), "mcpServers": []}
                )
            session = Session(self, client, result["sessionId"])
            request = await session.prompt()
        except (ClientRequestError, ConnectionLost, trio.TooSlowError, TimeoutError) as exc:
            row.observed = f"error: {_describe_error(exc)}"
            self.report(row, since)
            return None
        system = request.system_text()
        self.default = DefaultPrompt.from_text(system)
        row.observed = f"{len(system)} ch, {len(self.default.lines)} identifying lines"
        row.status = "PASS" if self.default.lines else "FAIL"
        if not self.default.lines:
            row.observed += " (the agent sent no system prompt of its own)"
        self.report(row, since)
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
        old, new = self.in_effect[mode], self.marker(mode, "changed")
        first = self.marker(mode, "new")
        expect = Expect(present=(new,), absent=(old,), default=_default_for(mode))
        limits = self.limits(agent, system_prompt(mode, old), system_prompt(mode, new))
        await self.step(
            step,
            mode,
            expect,
            self._names(first=first, marker=new, previous=old),
            lambda: self._reopen(client, method, session_id, system_prompt(mode, new)),
            limits=limits,
            wanted=system_prompt(mode, new),
            created=system_prompt(mode, first),
        )
        if not any(new in prompt.text for limit in limits for prompt in limit.misses):
            self.in_effect[mode] = new

    async def _fork(self, client: AcpClient, agent: Agent, mode: str, session_id: str) -> None:
        step = "fork with its own prompt"
        if not agent.fork:
            self.skip(step, mode, "the agent does not advertise session/fork")
            return
        parent, marker = self.in_effect[mode], self.marker(mode, "fork")

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
        await self.step(
            step,
            mode,
            expect,
            self._names(first=self.marker(mode, "new"), marker=marker, parent=parent),
            action,
            limits=self.limits(
                agent, system_prompt(mode, parent), system_prompt(mode, marker), fork=True
            ),
            wanted=system_prompt(mode, marker),
            created=system_prompt(mode, self.marker(mode, "new")),
        )

    async def _reopen_default(
        self, client: AcpClient, agent: Agent, mode: str, session_id: str
    ) -> None:
        method = self._reopen_method(agent, prefer="load")
        if method is None:
            self.skip("reopen after restart, omitted (default)", mode, self.no_reopen())
            return
        step = f"{method.split('/')[1]} after restart, omitted (default)"
        # None of the session's prompts may remain: not the one in effect, nor one that
        # was asked for earlier (a pinned first prompt outliving the default shows here).
        old, first, changed = (
            self.in_effect[mode],
            self.marker(mode, "new"),
            self.marker(mode, "changed"),
        )
        names = self._names(first=first, changed=changed, previous=old)
        expect = Expect(absent=tuple(names), default="kept")
        await self.step(
            step,
            mode,
            expect,
            names,
            lambda: self._reopen(client, method, session_id, None),
            limits=self.limits(agent, system_prompt(mode, old), None),
            created=system_prompt(mode, first),
        )


_NO_REOPEN: Final = "the agent advertises neither loadSession nor session/resume"


def _default_for(mode: str) -> Literal["kept", "gone"]:
    return "kept" if mode == "append" else "gone"


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return f"no answer within {STEP_TIMEOUT:.0f} s"
    return str(exc) or type(exc).__name__


def _start_error(exc: BaseException) -> AgentStartError | None:
    """The AgentStartError behind ``exc``, also from inside the bridge's exception group."""
    if isinstance(exc, AgentStartError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _start_error(inner)
        if found is not None:
            return found
    return None


# The table fits a 100-column terminal: the expected and observed text of a row wraps in
# its column, under each other, instead of widening the table.
TABLE_WIDTH: Final = 100
MIN_DETAILS_WIDTH: Final = 30
COLUMN_GAP: Final = "  "


def format_table(rows: Sequence[Row]) -> str:
    """One row per step: step, mode, what the model had to receive and what it did (wrapped
    in their column, the second under the first), and the result, last on the row's line."""
    header = ("step", "mode", "expected / observed", "result")
    step_width = max([len(header[0]), *(len(r.step) for r in rows)])
    mode_width = max([len(header[1]), *(len(r.mode) for r in rows)])
    result_width = max([len(header[3]), *(len(r.status) for r in rows)])
    details_width = max(
        MIN_DETAILS_WIDTH,
        TABLE_WIDTH - step_width - mode_width - result_width - 3 * len(COLUMN_GAP),
    )
    widths = (step_width, mode_width, details_width)

    def line(step: str, mode: str, details: str, result: str) -> str:
        cells = (step, mode, details)
        padded = (cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        return COLUMN_GAP.join((*padded, result)).rstrip()

    lines = [
        line(*header),
        COLUMN_GAP.join("-" * width for width in (*widths, result_width)),
    ]
    for row in rows:
        texts = [row.observed] if row.expectation == "-" else [row.expectation, row.observed]
        details = [part for text in texts if text for part in wrap_items(text, details_width)]
        details = details or [""]
        lines.append(line(row.step, row.mode, details[0], row.status))
        lines += [line("", "", part, "") for part in details[1:]]
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


def wrap_items(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``, broken after its ", " and "; " where it can
    (``default kept`` stays together), inside an item only when the item alone is longer."""
    items = re.findall(r".+?(?:[,;] |$)", text)
    lines: list[str] = []
    current = ""
    for item in items:
        if len(current) + len(item.rstrip()) <= width:
            current += item
            continue
        if current:
            lines.append(current.rstrip())
        current = ""
        if len(item.rstrip()) > width:
            *whole, current = textwrap.wrap(item, width, break_on_hyphens=False) or [""]
            lines += whole
            current += " "
        else:
            current = item
    if current.strip():
        lines.append(current.rstrip())
    return lines


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
    from acp_bridge.commands.cli import resolve_runtime

    variables = {"ENDPOINT_URL": ENDPOINT_PLACEHOLDER, "VERIFY_HOME": str(home)}
    lookup = {**os.environ, **variables}
    state = common.pop("state", None) or str(home / "verify-state.sqlite3")
    flavour: str | None = endpoint_flavour
    extra_env: dict[str, str] = {}
    extra_args: list[str] = []
    files: dict[Path, str] = {}
    agent_name = common.get("agent_name")
    if agent_name is None and not agent_cmd:
        common["agent_name"] = agent_name = DEFAULT_AGENT
    runtime = resolve_runtime(agent_cmd, state=state, variables=variables, **common)
    try:
        spec_name = agent_name
        if not agent_name and flavour is None and not env_pairs:
            # `verify -- npx -y <the claude preset's package>` needs no --endpoint/--env:
            # a preset with the same command says how to point the agent at the endpoint.
            spec_name = _preset_with_command(runtime.config, agent_cmd, lookup)
            if spec_name:
                progress(
                    f"the agent is pointed at the endpoint as preset {spec_name!r} does "
                    "(same command); the adapter is chosen as usual"
                )
        if spec_name:
            spec = runtime.config.agent(spec_name).verify
            if spec is None:
                raise click.ClickException(
                    f"the preset {spec_name!r} has no verify section: use -- AGENT_CMD "
                    "with --endpoint and --env instead"
                )
            flavour = flavour or spec.endpoint
            extra_env = spec.resolved_env(lookup)
            extra_args = spec.resolved_args(lookup)
            for folder in spec.resolved_dirs(lookup):
                folder.mkdir(parents=True, exist_ok=True)
            files = spec.resolved_files(lookup)
        extra_env.update(
            {k: expand(v, lookup, f"--env {k}") for k, v in _parse_env(env_pairs).items()}
        )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    if flavour not in FLAVOURS:
        raise click.UsageError(
            f"give --endpoint {'|'.join(FLAVOURS)} and --env NAME=VALUE settings that "
            "point the agent at ${ENDPOINT_URL}, or --agent NAME of a preset with a verify "
            "section"
        )
    options = dataclasses.replace(
        runtime.options,
        agent_argv=[*runtime.options.agent_argv, *extra_args],
        agent_env={**runtime.options.agent_env, **extra_env},
    )
    return VerifyPlan(
        options,
        runtime.registry,
        flavour,  # type: ignore[arg-type]
        home,
        runtime.state,
        runtime.install,
        files,
    )


def _preset_with_command(
    config: Config, agent_cmd: Sequence[str], variables: dict[str, str]
) -> str | None:
    """The preset with a verify section whose command line is exactly ``agent_cmd``."""
    for name, preset in config.agents.items():
        try:
            same = preset.resolved_command(variables) == list(agent_cmd)
        except ConfigError:
            continue
        if same and preset.verify is not None:
            return name
    return None


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
    files = {path: fill(text) for path, text in plan.files.items()}
    return dataclasses.replace(plan, options=options, files=files)


async def run_verify(
    plan: VerifyPlan, agent_log: AgentLog | None = None, verbose: bool = False
) -> list[Row]:
    """Run every step against a fresh endpoint; the table rows, in order."""
    async with open_model_endpoint() as endpoint:
        bound = bind_endpoint(plan, endpoint.url)
        progress(f"model endpoint {endpoint.url} ({plan.flavour})")
        bound.write_files()
        run = VerifyRun(bound, endpoint, agent_log, verbose)
        since = agent_log.size() if agent_log else 0
        try:
            await run.main()
        except (ClientRequestError, ConnectionLost, trio.TooSlowError, OSError) as exc:
            run.fail("run", "-", f"error: {_describe_error(exc)}")
            run.report(run.rows[-1], since)
        return run.rows


def command() -> click.Command:
    """The ``verify`` command; built on demand because it reuses the CLI's common options."""
    from acp_bridge.commands.cli import _common_options

    @click.command(
        "verify",
        context_settings={"allow_interspersed_args": False},
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
    @click.option(
        "--keep-home",
        is_flag=True,
        help="Keep the temporary home and the agent's stderr file for inspection.",
    )
    @click.option(
        "--verbose",
        "-v",
        is_flag=True,
        help="Show the agent's stderr under every row, not only under failing ones.",
    )
    @click.argument("agent_cmd", nargs=-1, type=click.UNPROCESSED)
    def verify(
        agent_cmd: tuple[str, ...],
        endpoint_flavour: str | None,
        env_pairs: tuple[str, ...],
        keep_home: bool,
        verbose: bool,
        **common: Any,
    ) -> None:
        """Prove delivery end to end against an embedded local model endpoint.

        Runs AGENT_CMD (or --agent NAME, default: claude) behind the bridge, creates
        sessions with marker prompts in every advertised mode and lifecycle step, and
        prints what the model received: the table on stdout, progress on stderr. The
        agent's own stderr goes to a private file (its path is printed; removed after a
        run without failures unless --keep-home or --verbose); its tail is shown under a
        failing row. Exit status 0 only if no row fails.
        """
        # The agent's configuration and the marker prompts go here; a watchdog removes it
        # should verify be killed, as it does a pool's private folders.
        keeper = Watchdog.start()
        home = PrivateDir.create("acp-bridge-verify-", keeper=keeper)
        agent_log = AgentLog()
        try:
            plan = _make_plan(agent_cmd, home.path, endpoint_flavour, env_pairs, common)
            progress(
                f"the agent's stderr goes to {agent_log.path} "
                "(kept if a row fails, or with --keep-home or --verbose)"
            )
            with agent_log.capturing() as console:
                CONSOLE.stream = console
                try:
                    rows = trio.run(run_verify, plan, agent_log, verbose)
                except Exception as exc:
                    start_error = _start_error(exc)
                    if start_error is None:
                        raise
                    message = str(start_error)
                    if plan.install:
                        message += f"\nTo get it: {plan.install}"
                    raise click.ClickException(message) from exc
                finally:
                    CONSOLE.stream = None
        finally:
            if keep_home:
                home.keep()
                progress(f"kept {home.path}")
            else:
                home.remove()
            keeper.release()
            agent_log.remove_if_empty()
        click.echo(format_table(rows))
        passed = succeeded(rows)
        if passed and not (keep_home or verbose):
            agent_log.path.unlink(missing_ok=True)
        elif agent_log.path.exists():
            progress(f"the agent's stderr is in {agent_log.path}")
        sys.exit(0 if passed else 1)

    return verify
