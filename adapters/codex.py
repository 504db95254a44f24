"""``codex``: one codex-acp process per distinct system prompt, presented as one agent.

codex-acp reads instructions only from its process configuration, loaded once at start:
``-c developer_instructions=<TOML string>`` adds a developer message (append) and
``-c model_instructions_file=<file>`` replaces the base instructions (override). Nothing
in an ACP session can change them. So this adapter keeps a pool of processes:

* the *primary* (started by the bridge) serves sessions without a prompt and every
  connection-wide method (``authenticate``, ``session/list``, ``logout``, ...);
* one process per prompt fingerprint (mode + text), started on first use and replayed
  the client's ``initialize``/``authenticate`` by the relay.

Session-scoped messages are routed by ``sessionId`` to the process holding the session.
codex keeps sessions on disk under ``CODEX_HOME``, shared by every process, so
``session/list`` is answered once, by the primary, and any process can load any session.

What a reopened session (``session/load`` / ``session/resume``) gets, measured on 0.16.0:
the developer message is part of the stored conversation and cannot change after
``session/new``; the base instructions are stored too, but a process started with an
override replaces them. :func:`reopen_effect` spells this out; changes that cannot apply
are logged on stderr.

Processes without a live session are stopped after ``idle_timeout`` seconds; at most
``max_processes`` run at once (the primary included). Options come from
``bridge.adapter_options.codex``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from acp_bridge.adapter import (
    Adapter,
    AdapterContext,
    AgentError,
    AgentExited,
    AgentLink,
    Delivery,
    LifecycleCall,
    ReopenLimit,
    Reply,
)
from acp_bridge.agent_process import AgentStartError
from acp_bridge.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, JsonObject
from acp_bridge.system_prompt import SystemPrompt

AGENT_NAME: Final = "codex-acp"
# codex-acp answers session/close before it has released the session's rollout writer, so
# a load/resume right after fails with -32603 (its stderr: "already has a live local
# writer"). Such a reopen is retried until the close is this old.
CLOSE_SETTLE_TIMEOUT: Final = 3.0
CLOSE_RETRY_INTERVAL: Final = 0.1
# Linux refuses a single argv string longer than MAX_ARG_STRLEN (32 pages, NUL included).
MAX_ARG_BYTES: Final = 32 * 4096 - 1


class CodexOptions(BaseModel):
    """``bridge.adapter_options.codex``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    idle_timeout: float = Field(default=300.0, ge=0)
    """Seconds a prompt's process may run without a live session before it is stopped."""
    max_processes: int = Field(default=8, ge=1)
    """codex-acp processes at once, the primary included."""


class CodexStartError(Exception):
    """A process for a prompt could not be started; the message is for the client."""

    def __init__(self, message: str, data: Any = None, code: int = INTERNAL_ERROR) -> None:
        super().__init__(message)
        self.data = data
        self.code = code

    def reply(self) -> Reply:
        return Reply.failure(self.code, str(self), self.data)


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, for ``-c key=<value>``.

    JSON's escapes are all valid TOML except that TOML also forbids a raw DEL; codex
    falls back to taking the whole value literally (quotes included) if it is not TOML.
    """
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


@dataclass
class Pooled:
    """One codex-acp process: the prompt it was started with and the sessions it holds."""

    link: AgentLink
    prompt: SystemPrompt | None
    instructions_file: Path | None = None
    sessions: set[str] = field(default_factory=set)
    busy: int = 0
    """Lifecycle calls using this process right now; a busy process is never reaped."""
    idle_since: float | None = None

    @property
    def key(self) -> str | None:
        return prompt_key(self.prompt)

    @property
    def reapable(self) -> bool:
        return not self.sessions and self.busy == 0 and self.prompt is not None


def prompt_key(prompt: SystemPrompt | None) -> str | None:
    return None if prompt is None else prompt.fingerprint()


def reopen_effect(
    created_with: SystemPrompt | None, wanted: SystemPrompt | None
) -> list[ReopenLimit]:
    """What of ``wanted`` cannot reach the model when a session created with
    ``created_with`` is reopened in ``wanted``'s process; one limit per problem, each
    saying what the model receives instead.

    codex stores the developer message in the conversation at ``session/new`` and the
    base instructions in the session's metadata; only an explicit override replaces
    the stored base instructions on reopen.
    """
    if prompt_key(created_with) == prompt_key(wanted):
        return []
    problems = []
    old_append = created_with if created_with and created_with.mode == "append" else None
    old_override = created_with if created_with and created_with.mode == "override" else None
    if wanted is not None and wanted.mode == "append":
        problems.append(
            ReopenLimit(
                "codex keeps a session's developer instructions from session/new; "
                "the new append prompt is not added",
                receives_created=old_append is not None,
                misses=(wanted,),
            )
        )
    if old_append is not None and (wanted is None or wanted.mode == "override"):
        problems.append(
            ReopenLimit(
                "the append prompt the session was created with stays in its history",
                receives_created=True,
            )
        )
    if old_override is not None and (wanted is None or wanted.mode == "append"):
        problems.append(
            ReopenLimit(
                "the override prompt the session was created with stays its base instructions",
                receives_created=True,
            )
        )
    return problems


class CodexAdapter(Adapter):
    name = "codex"
    description = "codex-acp: one process per distinct prompt, sessions routed by id"

    @classmethod
    def reopen_limits(
        cls, previous: SystemPrompt | None, prompt: SystemPrompt | None
    ) -> list[ReopenLimit]:
        return reopen_effect(previous, prompt)

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        try:
            self.options = CodexOptions.model_validate(dict(context.adapter_options(self.name)))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"bridge.adapter_options.codex: {problems}") from exc
        self.pool: dict[str | None, Pooled] = {}
        self.home: dict[str, Pooled] = {}
        """Live session -> the process holding it."""
        self._closed_at: dict[str, float] = {}
        """Session -> when it was last closed (trio clock), for reopen retries."""
        self._starting: dict[str, trio.Lock] = {}
        self._changed = trio.Event()
        self._reaper_running = False
        self._reserved = 0
        self._private_dir: Path | None = None

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        info = initialize_result.get("agentInfo")
        return isinstance(info, dict) and info.get("name") == AGENT_NAME

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=True)

    # ------------------------------------------------------------------ routing

    def route(self, method: str, params: Any) -> AgentLink | None:
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        pooled = self.home.get(session_id) if isinstance(session_id, str) else None
        if pooled is None or pooled.link.closed:
            return None
        return pooled.link

    def _primary(self) -> Pooled:
        pooled = self.pool.get(None)
        if pooled is None or pooled.link is not self.context.primary:
            pooled = Pooled(self.context.primary, None)
            self.pool[None] = pooled
        return pooled

    def _live(self, key: str | None) -> Pooled | None:
        if key is None:
            return self._primary()
        pooled = self.pool.get(key)
        if pooled is not None and pooled.link.closed:
            self._forget(pooled)
            return None
        return pooled

    async def _process_for(self, prompt: SystemPrompt | None) -> Pooled:
        """The process serving ``prompt``, started if needed; marked busy for the caller."""
        key = prompt_key(prompt)
        if key is None or prompt is None:
            pooled = self._primary()
            pooled.busy += 1
            return pooled
        lock = self._starting.setdefault(key, trio.Lock())
        async with lock:
            pooled = self._live(key) or await self._start(prompt)
            pooled.busy += 1
            return pooled

    def _release(self, pooled: Pooled) -> None:
        pooled.busy -= 1
        self._touch(pooled)

    # --------------------------------------------------------------- processes

    async def _start(self, prompt: SystemPrompt) -> Pooled:
        args, instructions_file = self._config_args(prompt)
        try:
            await self._make_room()
        except BaseException:
            self._remove_file(instructions_file)
            raise
        try:
            link = await self.context.spawn_agent(args)
        except (AgentStartError, AgentError, AgentExited) as exc:
            self._remove_file(instructions_file)
            raise CodexStartError(
                f"The bridge could not start a codex-acp process for this system prompt: {exc}"
            ) from exc
        finally:
            self._reserved -= 1
        pooled = Pooled(link, prompt, instructions_file)
        self.pool[pooled.key] = pooled
        self.log.info("%s serves %s prompt %s", link.name, prompt.mode, pooled.key)
        if not self._reaper_running:
            self._reaper_running = True
            self.context.start_soon(self._reap_idle)
        return pooled

    def _config_args(self, prompt: SystemPrompt) -> tuple[list[str], Path | None]:
        if prompt.mode == "append":
            value = "developer_instructions=" + toml_string(prompt.text)
            self._check_arg(value)
            return ["-c", value], None
        if not prompt.text.strip():
            # codex trims the file and refuses to start on an empty one.
            raise CodexStartError(
                "codex-acp cannot take an override system prompt that is only whitespace.",
                {"field": "systemPrompt.content"},
                INVALID_PARAMS,
            )
        path = self._write_instructions(prompt.text)
        value = "model_instructions_file=" + toml_string(str(path))
        return ["-c", value], path

    @staticmethod
    def _check_arg(value: str) -> None:
        size = len(value.encode())
        if size > MAX_ARG_BYTES:
            raise CodexStartError(
                f"The append system prompt is too long for codex-acp's command line "
                f"({size} bytes encoded, at most {MAX_ARG_BYTES}).",
                {"field": "systemPrompt.content"},
                INVALID_PARAMS,
            )

    def _write_instructions(self, text: str) -> Path:
        """The override text in a file only the user can read, in a private folder."""
        if self._private_dir is None:
            self._private_dir = Path(tempfile.mkdtemp(prefix="acp-bridge-codex-"))  # 0700
        fd, name = tempfile.mkstemp(suffix=".md", dir=self._private_dir)  # 0600
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return Path(name)

    @staticmethod
    def _remove_file(path: Path | None) -> None:
        if path is not None:
            path.unlink(missing_ok=True)

    def _forget(self, pooled: Pooled) -> None:
        if self.pool.get(pooled.key) is pooled:
            del self.pool[pooled.key]
        for session_id in list(pooled.sessions):
            if self.home.get(session_id) is pooled:
                del self.home[session_id]
        self._remove_file(pooled.instructions_file)
        pooled.instructions_file = None

    async def _stop(self, pooled: Pooled, why: str) -> None:
        self.log.info("stopping %s (%s)", pooled.link.name, why)
        self._forget(pooled)
        await self.context.stop_agent(pooled.link)

    def _running(self) -> int:
        """Processes running or being started, the primary included."""
        prompt_processes = [p for key, p in self.pool.items() if key is not None]
        return 1 + len(prompt_processes) + self._reserved

    async def _make_room(self) -> None:
        """Reserve a place under ``max_processes``: stop the longest-idle process, or refuse."""
        while True:
            for pooled in list(self.pool.values()):
                if pooled.link.closed:
                    self._forget(pooled)
            if self._running() < self.options.max_processes:
                self._reserved += 1
                return
            idle = [p for p in self.pool.values() if p.reapable]
            if not idle:
                raise CodexStartError(
                    f"Too many distinct system prompts in use: the bridge runs at most "
                    f"{self.options.max_processes} codex-acp processes and each one holds a "
                    f"live session. Close a session or reuse a prompt.",
                    {"maxProcesses": self.options.max_processes},
                )
            oldest = min(idle, key=lambda p: p.idle_since if p.idle_since is not None else 0.0)
            await self._stop(oldest, "making room for another prompt")

    def _touch(self, pooled: Pooled) -> None:
        """Start or clear the idle clock of a process after its sessions changed."""
        pooled.idle_since = trio.current_time() if pooled.reapable else None
        self._changed.set()

    async def _reap_idle(self) -> None:
        """Stop prompt processes that held no live session for ``idle_timeout``."""
        while True:
            self._changed = trio.Event()
            deadlines = [
                p.idle_since + self.options.idle_timeout
                for p in self.pool.values()
                if p.reapable and p.idle_since is not None
            ]
            with trio.move_on_at(min(deadlines, default=math.inf)):
                await self._changed.wait()
            now = trio.current_time()
            for pooled in list(self.pool.values()):
                expired = (
                    pooled.reapable
                    and pooled.idle_since is not None
                    and now >= pooled.idle_since + self.options.idle_timeout
                )
                if expired:
                    await self._stop(pooled, "idle")

    # --------------------------------------------------------------- sessions

    def _hold(self, session_id: str, pooled: Pooled) -> None:
        previous = self.home.get(session_id)
        if previous is not None and previous is not pooled:
            previous.sessions.discard(session_id)
            self._touch(previous)
        self.home[session_id] = pooled
        pooled.sessions.add(session_id)
        self._touch(pooled)

    def _drop(self, session_id: str) -> None:
        pooled = self.home.pop(session_id, None)
        if pooled is not None:
            pooled.sessions.discard(session_id)
            self._touch(pooled)

    async def _open(self, call: LifecycleCall) -> Reply:
        """session/new, session/fork: the new session lives in its prompt's process.

        codex-acp 0.16 has no fork; should a later one have it, the fork belongs with its
        prompt like any new session.
        """
        try:
            pooled = await self._process_for(call.prompt)
        except CodexStartError as exc:
            return exc.reply()
        try:
            reply = await call.forward(pooled.link)
            session_id = reply.result.get("sessionId") if isinstance(reply.result, dict) else None
            if reply.ok and isinstance(session_id, str):
                self._hold(session_id, pooled)
            return reply
        finally:
            self._release(pooled)

    session_new = _open
    session_fork = _open

    async def _reopen(self, call: LifecycleCall) -> Reply:
        """session/load, session/resume: open the session in its prompt's process."""
        session_id = call.session_id
        try:
            pooled = await self._process_for(call.prompt)
        except CodexStartError as exc:
            return exc.reply()
        try:
            if session_id is not None:
                await self._close_elsewhere(session_id, pooled)
            for problem in self.reopen_limits(call.previous, call.prompt):
                self.log.warning("%s of session %s: %s", call.method, session_id, problem)
            reply = await call.forward(pooled.link)
            while self._settling(session_id, reply):
                self.log.debug(
                    "%s of %s refused right after a close; retrying", call.method, session_id
                )
                await trio.sleep(CLOSE_RETRY_INTERVAL)
                reply = await call.forward(pooled.link)
            if reply.ok and session_id is not None:
                self._hold(session_id, pooled)
            return reply
        finally:
            self._release(pooled)

    session_load = _reopen
    session_resume = _reopen

    def _settling(self, session_id: str | None, reply: Reply) -> bool:
        """Whether a failed reopen may only be codex still releasing a recent close."""
        closed_at = self._closed_at.get(session_id) if session_id is not None else None
        return (
            closed_at is not None
            and reply.error is not None
            and reply.error.get("code") == INTERNAL_ERROR
            and trio.current_time() - closed_at < CLOSE_SETTLE_TIMEOUT
        )

    async def _close_elsewhere(self, session_id: str, target: Pooled) -> None:
        """A session is live in one process at a time: close it where it was."""
        current = self.home.get(session_id)
        if current is None or current is target:
            return
        self._drop(session_id)
        if current.link.closed:
            return
        try:
            await current.link.request("session/close", {"sessionId": session_id})
            self._closed_at[session_id] = trio.current_time()
        except (AgentError, AgentExited) as exc:
            self.log.warning(
                "closing session %s in %s failed: %s", session_id, current.link.name, exc
            )

    async def _end(self, call: LifecycleCall) -> Reply:
        """session/close, session/delete: the routed process answers; forget the session."""
        reply = await call.forward()
        if reply.ok and call.session_id is not None:
            self._drop(call.session_id)
            if call.method == "session/close":
                self._closed_at[call.session_id] = trio.current_time()
        return reply

    session_close = _end
    session_delete = _end

    async def aclose(self) -> None:
        # The relay stops every process on shutdown; only the files are left to us.
        for pooled in list(self.pool.values()):
            self._remove_file(pooled.instructions_file)
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None
