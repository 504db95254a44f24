"""The process pool: one agent process per distinct system prompt, presented as one agent.

Some agents take their system prompt only as process configuration (arguments,
environment, files read at start): codex-acp, gemini-cli, qwen-code. :class:`PoolAdapter`
serves such an agent with several processes behind one client connection:

* the *primary* (started by the bridge) serves sessions without a prompt and every
  connection-wide method (``authenticate``, ``session/list``, ``logout``, ...);
* one process per prompt fingerprint (mode + text), started on first use through
  :meth:`AdapterContext.spawn_agent`, which replays the client's ``initialize`` and
  ``authenticate`` to it;
* session-scoped messages go by ``sessionId`` to the process holding the session (the
  pool places each session through :meth:`AdapterContext.place_session`); a session
  reopened under another prompt is closed where it was first, so it is live in one process
  at a time;
* a process without a live session is stopped after ``idle_timeout`` seconds; at most
  ``max_processes`` run at once (the primary included) and past that a new prompt gets a
  clear error; every process is stopped and every private file removed on shutdown;
* with ``spare: true``, where the agent reads its prompt files only when a session starts
  (the adapter names those prompt modes in :attr:`PoolAdapter.spare_modes`, or decides in
  :meth:`PoolAdapter.spares_for`), a *spare*
  process is started in the background after a new prompt's process: started and
  initialized with a private folder that holds no prompt yet, it is claimed by the next
  new prompt of its mode, whose files are written into its folder before ``session/new``
  is forwarded to it, so that prompt does not wait for the agent's cold start. A spare
  only takes a free place under ``max_processes`` (it is the first process stopped to make
  room), is stopped after ``idle_timeout`` unclaimed, and is never started for a mode the
  agent reads at start. It is one more agent process while it waits, so it is off unless
  asked for.

A subclass only says how a prompt becomes a process: :meth:`PoolAdapter.process_config`
gets the prompt and a :class:`~acp_bridge.supervision.private_dirs.PrivateDir` (mode 0700, made for
that one process, removed when it stops; a watchdog removes it should the bridge be
killed, and a bridge starting with the same adapter removes what a dead one left) and
returns the extra arguments and environment; for a spare, :meth:`PoolAdapter.spare_config`
and :meth:`PoolAdapter.fill_spare` split that in two. Options come from
``bridge.adapter_options.<adapter name>`` (:class:`PoolOptions`).

Only the public :class:`~acp_bridge.adapter.AdapterContext` is used: a process that exits
on its own is dropped with its files when its link's ``wait_closed()`` returns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, TypeAlias

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
    Reply,
)
from acp_bridge.core.capabilities import agent_name
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.supervision.agent_process import AgentStartError
from acp_bridge.supervision.agent_watchdog import Watchdog
from acp_bridge.supervision.private_dirs import PrivateDir as _PrivateDir
from acp_bridge.supervision.private_dirs import sweep
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, JsonObject

# The answer when every process the pool may run holds a live session: a bound the client
# can act on (close a session, reuse a prompt, try later), not a fault of the bridge, so
# not -32603. An implementation-defined server error (JSON-RPC leaves -32000..-32099 to
# implementations; ACP itself uses -32000 and -32002); 29 after HTTP's 429.
AT_CAPACITY: Final = -32029


@dataclass(frozen=True)
class ProcessConfig:
    """What one pooled process gets on top of the agent command the user configured."""

    args: Sequence[str] = ()
    """Extra arguments; no prompt text here where the agent allows any other route."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables."""


def check_process_config(config: ProcessConfig, prompt: SystemPrompt, agent_label: str) -> None:
    """Refuse a prompt that made ``config`` something no process can be started with.

    A NUL (U+0000) is valid in JSON text, but arguments and environment strings are C
    strings: the client gets ``-32602`` naming the block, not a failed start.
    """
    routes = (("command line", config.args), ("environment", [*config.env, *config.env.values()]))
    for route, strings in routes:
        if any("\0" in value for value in strings):
            index = next((i for i, b in enumerate(prompt.content) if "\0" in b.text), None)
            field = "systemPrompt.content" + ("" if index is None else f"[{index}].text")
            raise PromptRefused(
                f"{agent_label} takes this system prompt on its {route}, which cannot carry "
                "a NUL character (U+0000).",
                {"field": field},
                INVALID_PARAMS,
            )


PrivateDir = _PrivateDir
"""What :meth:`PoolAdapter.process_config` writes a process's files in (adapters import it
from here)."""


class PromptRefused(Exception):
    """No process can serve this prompt; the message is for the client."""

    def __init__(self, message: str, data: Any = None, code: int = INTERNAL_ERROR) -> None:
        super().__init__(message)
        self.data = data
        self.code = code

    def reply(self) -> Reply:
        return Reply.failure(self.code, str(self), self.data)


class PoolOptions(BaseModel):
    """``bridge.adapter_options.<name>`` of a pool adapter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    idle_timeout: float = Field(default=300.0, ge=0)
    """Seconds a prompt's process may run without a live session before it is stopped."""
    max_processes: int = Field(default=8, ge=1)
    """Agent processes at once, the primary included."""
    spare: bool = False
    """Keep a spare process started for the next new prompt, where the agent allows it."""


def prompt_key(prompt: SystemPrompt | None) -> str | None:
    """The pool key of a prompt: its fingerprint; ``None`` is the primary's."""
    return None if prompt is None else prompt.fingerprint()


@dataclass
class PooledProcess:
    """One agent process: the prompt it was started with and the sessions it holds."""

    link: AgentLink
    prompt: SystemPrompt | None
    private: PrivateDir | None = None
    sessions: set[str] = field(default_factory=set)
    busy: int = 0
    """Lifecycle calls using this process right now; a busy process is never reaped."""
    idle_since: float | None = None
    spare_mode: str | None = None
    """The prompt mode a spare process was prepared for; None once claimed (or never a spare)."""

    @property
    def key(self) -> str | None:
        return prompt_key(self.prompt)

    @property
    def reapable(self) -> bool:
        return not self.sessions and self.busy == 0 and self.prompt is not None


Opened: TypeAlias = tuple[Reply, str | None]
"""A lifecycle call served in a process: the reply, and the session now open there."""


class PoolAdapter(Adapter):
    """An agent whose prompt is per-process configuration: one process per prompt."""

    agent_label: ClassVar[str] = "agent"
    """The agent as messages to the client name it (``codex-acp``)."""
    reported_name: ClassVar[str | None] = None
    """The name the agent reports in its initialize result (``agentInfo.name``): the
    adapter is chosen for an agent that reports it."""
    options_model: ClassVar[type[PoolOptions]] = PoolOptions
    close_settle_timeout: ClassVar[float] = 0.0
    """Seconds after a ``session/close`` during which a failed reopen of that session is
    retried (errors :meth:`still_releasing` accepts; ``-32603`` by default): for agents that
    answer the close before releasing it."""
    close_retry_interval: ClassVar[float] = 0.1
    released_on_exit: ClassVar[bool] = False
    """The agent lets go of a closed session only when its process exits (codex-acp 2.x
    keeps the session's writer): a reopen in another process that the agent refuses as
    still held (:meth:`still_releasing`) stops the pool process the session was closed
    in, when that one holds no other session, and is tried again."""
    spare_modes: ClassVar[frozenset[str]] = frozenset()
    """The prompt modes in which the agent reads its prompt files only when a session
    starts, not when the process starts: a spare process can be started before the
    prompt is known (:meth:`spare_config`, :meth:`fill_spare`). Name a mode here only once
    a test against the real agent has shown it (a file written after ``initialize``
    reaches the model)."""

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        try:
            self.options = self.options_model.model_validate(
                dict(context.adapter_options(self.name))
            )
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"bridge.adapter_options.{self.name}: {problems}") from exc
        self.pool: dict[str | None, PooledProcess] = {}
        """Prompt fingerprint (None: the primary) -> its process."""
        self.home: dict[str, PooledProcess] = {}
        """Live session -> the process holding it."""
        self._closed_at: dict[str, float] = {}
        """Session -> when it was last closed (trio clock), for reopen retries."""
        self._closed_in: dict[str, PooledProcess] = {}
        """Session -> the running process it was last closed in (``released_on_exit``)."""
        self._starting: dict[str, trio.Lock] = {}
        self._changed = trio.Event()
        self._reaper_running = False
        self._reserved = 0
        self._stopping = False
        self._spare: PooledProcess | None = None
        """A started process no prompt has claimed yet (see :meth:`spare_config`)."""
        self._spare_starting: tuple[str, trio.Event] | None = None
        """The mode of a spare being started, and the event set when that start ends."""
        self._keeper: Watchdog | None = None
        """The watchdog of the private folders: started with the first one."""
        self._sweep()

    # ------------------------------------------------------------ what a subclass says

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        return cls.reported_name is not None and agent_name(initialize_result) == cls.reported_name

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        """How ``prompt`` becomes a process: arguments, environment, files in ``private``.

        Raise :class:`PromptRefused` for a prompt this agent cannot take.
        """
        raise NotImplementedError

    def process_prompt(self, prompt: SystemPrompt | None) -> SystemPrompt | None:
        """The prompt a process must be started with to serve a session that runs with
        ``prompt``; ``None``: the primary serves it. An agent that takes part of the
        capability natively (codex-acp 2.x: append) keeps those sessions in the primary and
        gets the prompt in the request; the pool starts processes only for the rest."""
        return prompt

    def spares_for(self, mode: str) -> bool:
        """Whether a spare process can be started for ``mode`` prompts: whether the mode is
        one of :attr:`spare_modes` (an adapter whose agent versions differ decides here)."""
        return mode in self.spare_modes

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        """How a process is started for a ``mode`` prompt (see :meth:`spares_for`) that
        is not known yet. Write no prompt text: ``private`` holds none until the process is
        claimed. Raise :class:`PromptRefused` when no spare can be prepared.
        """
        raise NotImplementedError

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        """Write ``prompt``'s files into a spare's ``private`` folder (prepared by
        :meth:`spare_config` for ``prompt.mode``), before its first session starts; the
        process then serves ``prompt`` as one :meth:`process_config` started would.

        Raise :class:`PromptRefused` for a prompt this agent cannot take.
        """
        raise NotImplementedError

    def private_root(self) -> Path | None:
        """Where the private directories are made; None: the system's temporary folder."""
        return None

    async def opened(self, link: AgentLink, session_id: str, prompt: SystemPrompt | None) -> None:
        """A session was opened (new, fork, load, resume) in ``link``'s process with
        ``prompt``: per-session work an agent needs (e.g. selecting a mode) goes here,
        before the client sees the response. Raise :class:`PromptRefused` to answer the
        client with an error instead (the session stays open in the agent)."""

    def agent_environment(self) -> Mapping[str, str] | None:
        """The environment the agent's processes start with (the bridge's own plus the
        configured agent environment), or None when the context cannot say.

        An adapter needs it to find the agent's own files (its home, its settings) the way
        the agent will. It is read from ``AdapterContext.agent_environment()`` where the
        context offers that method.
        """
        provided = getattr(self.context, "agent_environment", None)
        if not callable(provided):
            return None
        environment: Mapping[str, str] = provided()
        return environment

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=True)

    # ---------------------------------------------------------------- processes

    def processes(self) -> list[PooledProcess]:
        """The processes running now, the primary first."""
        return [self._primary(), *(p for k, p in self.pool.items() if k is not None)]

    def _primary(self) -> PooledProcess:
        pooled = self.pool.get(None)
        if pooled is None or pooled.link is not self.context.primary:
            pooled = PooledProcess(self.context.primary, None)
            self.pool[None] = pooled
        return pooled

    def _live(self, key: str | None) -> PooledProcess | None:
        if key is None:
            return self._primary()
        pooled = self.pool.get(key)
        if pooled is not None and pooled.link.closed:
            self._forget(pooled)
            return None
        return pooled

    async def _process_for(self, prompt: SystemPrompt | None) -> tuple[PooledProcess, bool]:
        """The process serving ``prompt``, started (or a spare claimed) if needed, marked
        busy for the caller; and whether it was started for this call."""
        prompt = self.process_prompt(prompt)
        key = prompt_key(prompt)
        if key is None or prompt is None:
            pooled = self._primary()
            pooled.busy += 1
            return pooled, False
        lock = self._starting.setdefault(key, trio.Lock())
        try:
            async with lock:
                live = self._live(key)
                served = live or await self._start(prompt)
                served.busy += 1
                return served, live is None
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._starting.pop(key, None)  # one lock per prompt ever seen, otherwise

    def _release(self, pooled: PooledProcess) -> None:
        pooled.busy -= 1
        self._touch(pooled)

    # --------------------------------------------------------------- processes

    def _private_prefix(self) -> str:
        return f"acp-bridge-{self.name}-"

    def _sweep(self) -> None:
        """Remove the private folders a dead bridge with this adapter left."""
        try:
            removed = sweep(self._private_prefix(), self.private_root())
        except OSError as exc:
            self.log.warning("could not look for private folders a stopped bridge left: %s", exc)
            return
        if removed:
            self.log.info("removed %d private folder(s) a stopped bridge left", removed)

    async def _start(self, prompt: SystemPrompt) -> PooledProcess:
        if self._stopping:
            raise PromptRefused("The bridge is shutting down.")
        claimed = await self._claim_spare(prompt)
        if claimed is not None:
            return claimed
        private = self._private_dir()
        try:
            config = self.process_config(prompt, private)
            check_process_config(config, prompt, self.agent_label)
            await self._make_room()
            try:
                link = await self.context.spawn_agent(
                    list(config.args), dict(config.env), [str(private.path)]
                )
            except (AgentStartError, AgentError, AgentExited) as exc:
                raise PromptRefused(
                    f"The bridge could not start a {self.agent_label} process for this "
                    f"system prompt: {exc}"
                ) from exc
            finally:
                self._reserved -= 1
        except BaseException:
            private.remove()
            raise
        pooled = PooledProcess(link, prompt, private)
        self.pool[pooled.key] = pooled
        self.log.info("%s serves %s prompt %s", link.name, prompt.mode, pooled.key)
        self.context.start_soon(self._watch_exit, pooled)
        self._start_reaper()
        return pooled

    def _private_dir(self) -> PrivateDir:
        """A new private folder, named to the watchdog before anything is written in it."""
        if self._keeper is None:
            self._keeper = Watchdog.start()
        return PrivateDir.create(self._private_prefix(), self.private_root(), self._keeper)

    def _start_reaper(self) -> None:
        if not self._reaper_running:
            self._reaper_running = True
            self.context.start_soon(self._reap_idle)

    # ------------------------------------------------------------------ spares

    async def _claim_spare(self, prompt: SystemPrompt) -> PooledProcess | None:
        """The spare process, now serving ``prompt``, if one of its mode runs or is being
        started (that start is waited for: it is further on than a new one would be)."""
        starting = self._spare_starting
        if starting is not None and starting[0] == prompt.mode and self._spare is None:
            await starting[1].wait()
        spare = self._spare
        if spare is None or spare.spare_mode != prompt.mode or spare.link.closed:
            return None
        assert spare.private is not None
        self._spare = None
        try:
            self.fill_spare(prompt, spare.private)
        except BaseException:
            # It may hold part of a refused prompt now: it serves nothing else.
            self.context.start_soon(self._stop, spare, "its prompt was refused")
            raise
        spare.prompt, spare.spare_mode = prompt, None
        self.pool[spare.key] = spare
        self.log.info("%s (spare) serves %s prompt %s", spare.link.name, prompt.mode, spare.key)
        return spare

    async def _prepare_spare(self, mode: str) -> None:
        """Start a spare process for the next new ``mode`` prompt, if the agent allows one
        and a place under ``max_processes`` is free (no process is stopped for it)."""
        current = self._spare
        if (
            not self.options.spare
            or not self.spares_for(mode)
            or self._stopping
            or self._spare_starting is not None
            or (current is not None and current.spare_mode == mode)
        ):
            return
        if current is not None:
            await self._stop(current, f"a spare for {mode} prompts replaces it")
        if self._running() >= self.options.max_processes:
            return
        done = trio.Event()
        self._spare_starting = (mode, done)
        self._reserved += 1
        try:
            await self._start_spare(mode)
        finally:
            self._reserved -= 1
            self._spare_starting = None
            done.set()
            self._changed.set()

    async def _start_spare(self, mode: str) -> None:
        try:
            private = self._private_dir()
        except OSError as exc:
            # Only a spare is lost: the task runs in the relay's nursery, which must go on.
            self.log.info("no spare %s process: %s", self.agent_label, exc)
            return
        try:
            config = self.spare_config(mode, private)
            link = await self.context.spawn_agent(
                list(config.args), dict(config.env), [str(private.path)]
            )
        except (PromptRefused, AgentStartError, AgentError, AgentExited, OSError) as exc:
            private.remove()
            self.log.info("no spare %s process: %s", self.agent_label, exc)
            return
        except BaseException:
            private.remove()
            raise
        spare = PooledProcess(link, None, private, spare_mode=mode)
        spare.idle_since = trio.current_time()
        self._spare = spare
        self.context.start_soon(self._watch_exit, spare)
        self._start_reaper()
        self.log.info("%s started as a spare for %s prompts", link.name, mode)
        if self._stopping:
            await self._stop(spare, "shutdown")

    def _forget(self, pooled: PooledProcess, *, keep_files: bool = False) -> None:
        if self._spare is pooled:
            self._spare = None
        elif self.pool.get(pooled.key) is pooled:
            del self.pool[pooled.key]
        for session_id in list(pooled.sessions):
            if self.home.get(session_id) is pooled:
                del self.home[session_id]
                self.context.unplace_session(session_id)
        if pooled.private is not None and not keep_files:
            pooled.private.remove()
        self._changed.set()

    async def _stop(self, pooled: PooledProcess, why: str) -> None:
        """Stop a process; its files go once it has stopped reading them."""
        self.log.info("stopping %s (%s)", pooled.link.name, why)
        self._forget(pooled, keep_files=True)
        try:
            if not pooled.link.closed:
                await self.context.stop_agent(pooled.link)
        finally:
            if pooled.private is not None:
                pooled.private.remove()

    async def _watch_exit(self, pooled: PooledProcess) -> None:
        """Drop a process that exited on its own, with its private files (one the pool
        stopped itself is no longer in the pool: it cleaned up then)."""
        await pooled.link.wait_closed()
        claimed = pooled.prompt is not None and self.pool.get(pooled.key) is pooled
        if self._spare is pooled or claimed:
            # The relay logs how it exited; a crash is a warning there.
            self.log.info("%s exited; its sessions are gone", pooled.link.name)
            self._forget(pooled)

    def _running(self) -> int:
        """Processes running or being started, the primary and a spare included."""
        spare = 0 if self._spare is None else 1
        return 1 + sum(1 for key in self.pool if key is not None) + spare + self._reserved

    async def _make_room(self) -> None:
        """Reserve a place under ``max_processes``: stop the longest-idle process, or refuse."""
        while True:
            for pooled in list(self.pool.values()):
                if pooled.prompt is not None and pooled.link.closed:
                    self._forget(pooled)
            if self._running() < self.options.max_processes:
                self._reserved += 1
                return
            if self._spare is not None:
                await self._stop(self._spare, "making room for another prompt")
                continue
            idle = [p for p in self.pool.values() if p.reapable]
            if not idle:
                raise PromptRefused(
                    f"The bridge is at capacity: it runs at most {self.options.max_processes} "
                    f"{self.agent_label} processes, one per distinct system prompt, and each "
                    "holds a live session; close a session or reuse a prompt.",
                    {"maxProcesses": self.options.max_processes},
                    AT_CAPACITY,
                )
            oldest = min(idle, key=lambda p: p.idle_since if p.idle_since is not None else 0.0)
            await self._stop(oldest, "making room for another prompt")

    def _touch(self, pooled: PooledProcess) -> None:
        """Start or clear the idle clock of a process after its sessions changed."""
        pooled.idle_since = trio.current_time() if pooled.reapable else None
        self._changed.set()

    async def _reap_idle(self) -> None:
        """Stop prompt processes that held no live session for ``idle_timeout``."""
        while not self._stopping:
            self._changed = trio.Event()
            deadlines = [
                p.idle_since + self.options.idle_timeout
                for p in self.pool.values()
                if p.reapable and p.idle_since is not None
            ]
            spare = self._spare
            if spare is not None and spare.idle_since is not None:
                deadlines.append(spare.idle_since + self.options.idle_timeout)
            with trio.move_on_at(min(deadlines, default=math.inf)):
                await self._changed.wait()
            now = trio.current_time()
            spare = self._spare
            if (
                spare is not None
                and spare.idle_since is not None
                and now >= spare.idle_since + self.options.idle_timeout
                and not self._stopping
            ):
                await self._stop(spare, "an unclaimed spare, idle")
            for pooled in list(self.pool.values()):
                expired = (
                    pooled.reapable
                    and pooled.idle_since is not None
                    and now >= pooled.idle_since + self.options.idle_timeout
                )
                if expired and not self._stopping:
                    await self._stop(pooled, "idle")

    # --------------------------------------------------------------- sessions

    def _hold(self, session_id: str, pooled: PooledProcess) -> None:
        previous = self.home.get(session_id)
        if previous is not None and previous is not pooled:
            previous.sessions.discard(session_id)
            self._touch(previous)
        self.home[session_id] = pooled
        pooled.sessions.add(session_id)
        self._touch(pooled)
        self.context.place_session(session_id, pooled.link)

    def _drop(self, session_id: str) -> None:
        pooled = self.home.pop(session_id, None)
        if pooled is not None:
            pooled.sessions.discard(session_id)
            self._touch(pooled)
            self.context.unplace_session(session_id)

    async def _in_prompts_process(
        self, call: LifecycleCall, serve: Callable[[PooledProcess], Awaitable[Opened]]
    ) -> Reply:
        """Serve ``call`` in its prompt's process; the session ``serve`` opened lives there.

        A prompt the agent cannot take, refused on the way, is the client's answer.
        """
        try:
            pooled, started = await self._process_for(call.prompt)
        except PromptRefused as exc:
            return exc.reply()
        try:
            reply, session_id = await serve(pooled)
            if session_id is not None:
                self._hold(session_id, pooled)
                await self.opened(pooled.link, session_id, call.prompt)
            return reply
        except PromptRefused as exc:
            return exc.reply()
        finally:
            self._release(pooled)
            if started and pooled.prompt is not None:
                # The next new prompt of this mode need not wait for a cold start. Started
                # after this call, so as not to slow its session/new.
                self.context.start_soon(self._prepare_spare, pooled.prompt.mode)

    async def _open(self, call: LifecycleCall) -> Reply:
        """session/new, session/fork: the new session lives in its prompt's process."""

        async def serve(pooled: PooledProcess) -> Opened:
            reply = await call.forward(pooled.link)
            session_id = reply.result.get("sessionId") if isinstance(reply.result, dict) else None
            return reply, session_id if reply.ok and isinstance(session_id, str) else None

        return await self._in_prompts_process(call, serve)

    session_new = _open
    session_fork = _open

    async def _reopen(self, call: LifecycleCall) -> Reply:
        """session/load, session/resume: open the session in its prompt's process."""
        session_id = call.session_id

        async def serve(pooled: PooledProcess) -> Opened:
            if session_id is not None:
                await self._close_elsewhere(session_id, pooled)
            for problem in self.reopen_limits(call.previous, call.prompt):
                self.log.warning("%s of session %s: %s", call.method, session_id, problem)
            reply = await call.forward(pooled.link)
            if session_id is not None and await self._stop_holder(session_id, pooled, reply):
                reply = await call.forward(pooled.link)
            while self._settling(session_id, reply):
                self.log.debug(
                    "%s of %s refused right after a close; retrying", call.method, session_id
                )
                await trio.sleep(self.close_retry_interval)
                reply = await call.forward(pooled.link)
            return reply, session_id if reply.ok else None

        return await self._in_prompts_process(call, serve)

    session_load = _reopen
    session_resume = _reopen

    def _settling(self, session_id: str | None, reply: Reply) -> bool:
        """Whether a failed reopen may only be the agent still releasing a recent close."""
        closed_at = self._closed_at.get(session_id) if session_id is not None else None
        return (
            closed_at is not None
            and reply.error is not None
            and self.still_releasing(reply.error)
            and trio.current_time() - closed_at < self.close_settle_timeout
        )

    def still_releasing(self, error: JsonObject) -> bool:
        """Whether a reopen's error may mean the agent is still releasing a session it
        was told to close (retried for ``close_settle_timeout``): by default ``-32603``."""
        return error.get("code") == INTERNAL_ERROR

    async def _stop_holder(self, session_id: str, target: PooledProcess, reply: Reply) -> bool:
        """For a ``released_on_exit`` agent that refused to reopen a closed session as
        still held: stop the pool process it was closed in, if nothing else lives there."""
        holder = self._closed_in.pop(session_id, None)
        if (
            not self.released_on_exit
            or reply.error is None
            or not self.still_releasing(reply.error)
            or holder is None
            or holder is target
            or not holder.reapable
            or self.pool.get(holder.key) is not holder
        ):
            return False
        await self._stop(holder, f"it still holds session {session_id}, reopened elsewhere")
        return True

    async def _close_elsewhere(self, session_id: str, target: PooledProcess) -> None:
        """A session is live in one process at a time: close it where it was."""
        current = self.home.get(session_id)
        if current is None or current is target:
            return
        self._drop(session_id)
        if current.link.closed:
            return
        try:
            await current.link.request("session/close", {"sessionId": session_id})
            self._note_closed(session_id, current)
        except AgentError as exc:
            # An agent without session/close keeps a stale copy there; nothing routes to it.
            missing = exc.error.get("code") == METHOD_NOT_FOUND
            level = logging.DEBUG if missing else logging.WARNING
            self.log.log(
                level, "closing session %s in %s failed: %s", session_id, current.link.name, exc
            )
        except AgentExited as exc:
            self.log.warning(
                "closing session %s in %s failed: %s", session_id, current.link.name, exc
            )

    async def _end(self, call: LifecycleCall) -> Reply:
        """session/close, session/delete: the routed process answers; forget the session."""
        reply = await call.forward()
        if reply.ok and call.session_id is not None:
            holder = self.home.get(call.session_id)
            self._drop(call.session_id)
            if call.method == "session/close":
                self._note_closed(call.session_id, holder)
        return reply

    def _note_closed(self, session_id: str, holder: PooledProcess | None) -> None:
        """Remember a close for :meth:`_settling`, forgetting those past the settle window,
        and (``released_on_exit``) the process it was closed in, while that one runs."""
        now = trio.current_time()
        self._closed_at = {
            closed: at
            for closed, at in self._closed_at.items()
            if now - at < self.close_settle_timeout
        }
        self._closed_at[session_id] = now
        if self.released_on_exit:
            self._closed_in = {
                closed: pooled
                for closed, pooled in self._closed_in.items()
                if self.pool.get(pooled.key) is pooled
            }
            if holder is not None:
                self._closed_in[session_id] = holder

    session_close = _end
    session_delete = _end

    async def aclose(self) -> None:
        """Stop every process the pool started that still runs, and remove every file."""
        self._stopping = True
        self._changed.set()
        with trio.CancelScope(shield=True):
            started = [p for key, p in list(self.pool.items()) if key is not None]
            for pooled in [*started, *([self._spare] if self._spare else [])]:
                await self._stop(pooled, "shutdown")
        keeper, self._keeper = self._keeper, None
        if keeper is not None and self._spare_starting is None:
            keeper.release()
        # Otherwise a spare being started still has its folder: the watchdog removes it
        # when the bridge exits, should the start not end in time for the bridge to.
