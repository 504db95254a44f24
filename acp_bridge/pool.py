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

This module owns the sessions: which process holds each, the lifecycle calls that open
and close them there, and what a subclass says. The processes themselves (starting,
stopping, the bound, idle reaping, the spare, private folders) are
:class:`~acp_bridge.pool_processes.PoolProcesses`'.

A subclass only says how a prompt becomes a process: :meth:`PoolAdapter.process_config`
gets the prompt and a :class:`~acp_bridge.supervision.private_dirs.PrivateDir` (mode 0700, made for
that one process, removed when it stops; a watchdog removes it should the bridge be
killed, and a bridge starting with the same adapter removes what a dead one left) and
returns the extra arguments and environment; for a spare, :meth:`PoolAdapter.spare_config`
and :meth:`PoolAdapter.fill_spare` split that in two (and then make the default
``process_config``). An agent that offers no way to replace its own prompt sets
:attr:`PoolAdapter.append_only`. Options come from ``bridge.adapter_options.<adapter
name>`` (:class:`PoolOptions`).

Only the public :class:`~acp_bridge.adapter.AdapterContext` is used: a process that exits
on its own is dropped with its files when its link's ``wait_closed()`` returns.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import ClassVar, TypeAlias

import trio
from pydantic import ValidationError

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
from acp_bridge.pool_processes import (
    AT_CAPACITY,
    PooledProcess,
    PoolOptions,
    PoolProcesses,
    ProcessConfig,
    PromptRefused,
    check_process_config,
    prompt_key,
    write_prompt_file,
)
from acp_bridge.supervision.private_dirs import PrivateDir as _PrivateDir
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, JsonObject

__all__ = [
    "AT_CAPACITY",
    "PoolAdapter",
    "PoolOptions",
    "PooledProcess",
    "PrivateDir",
    "ProcessConfig",
    "PromptRefused",
    "check_process_config",
    "prompt_key",
    "write_prompt_file",
]

PrivateDir = _PrivateDir
"""What :meth:`PoolAdapter.process_config` writes a process's files in (adapters import it
from here)."""

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
    append_only: ClassVar[bool] = False
    """The agent offers no way to replace its own system prompt: :meth:`delivery` offers
    ``append`` only, and the default :meth:`process_config` refuses any other mode."""

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
        self.home: dict[str, PooledProcess] = {}
        """Live session -> the process holding it."""
        self._closed_at: dict[str, float] = {}
        """Session -> when it was last closed (trio clock), for reopen retries."""
        self._closed_in: dict[str, PooledProcess] = {}
        """Session -> the running process it was last closed in (``released_on_exit``)."""
        self._starting: dict[str, trio.Lock] = {}
        self.processes = PoolProcesses(
            context,
            self.options,
            self,
            label=self.agent_label,
            prefix=f"acp-bridge-{self.name}-",
            log=self.log,
            on_gone=self._gone,
        )

    # ------------------------------------------------------------ what a subclass says

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        return cls.reported_name is not None and agent_name(initialize_result) == cls.reported_name

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        """How ``prompt`` becomes a process: arguments, environment, files in ``private``.

        By default the process a spare claimed by ``prompt`` would be (:meth:`spare_config`,
        then :meth:`fill_spare`), after refusing a mode an :attr:`append_only` agent lacks.
        Raise :class:`PromptRefused` for a prompt this agent cannot take.
        """
        if self.append_only and prompt.mode != "append":
            raise PromptRefused(
                f"{self.agent_label} offers no way to replace its own system prompt; "
                "use mode append.",
                {"field": "systemPrompt.mode"},
                INVALID_PARAMS,
            )
        config = self.spare_config(prompt.mode, private)
        self.fill_spare(prompt, private)
        return config

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

    def agent_variable(self, name: str) -> str | None:
        """The agent's own value of the environment variable ``name``: from
        :meth:`agent_environment`, or the bridge's own environment when the context cannot
        say (the agent inherits it)."""
        environment = self.agent_environment()
        return (os.environ if environment is None else environment).get(name)

    def refuse_if_set(self, name: str, instead: str) -> None:
        """Refuse a prompt the bridge gives the agent through the variable ``name`` while
        the agent's own environment sets it: one variable holds one value, and replacing
        the user's would silently drop it. ``instead``: where the user can move theirs."""
        own = self.agent_variable(name)
        if own:
            raise PromptRefused(
                f"The bridge gives {self.agent_label} a system prompt through {name}, which "
                f"is already set for the agent ({own}); move that configuration to "
                f"{instead}, or unset {name}.",
                {"variable": name},
            )

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=not self.append_only)

    # ---------------------------------------------------------------- processes

    async def _process_for(self, prompt: SystemPrompt | None) -> tuple[PooledProcess, bool]:
        """The process serving ``prompt``, started (or a spare claimed) if needed, marked
        busy for the caller; and whether it was started for this call."""
        prompt = self.process_prompt(prompt)
        key = prompt_key(prompt)
        if key is None or prompt is None:
            pooled = self.processes.primary()
            pooled.busy += 1
            return pooled, False
        live = self.processes.live(key)
        if live is not None:
            # The usual case, a prompt whose process runs: no lock, so no trip to the
            # scheduler (a trio lock is a checkpoint even when it is free).
            live.busy += 1
            return live, False
        lock = self._starting.setdefault(key, trio.Lock())
        try:
            async with lock:
                live = self.processes.live(key)
                served = live or await self.processes.start(prompt)
                served.busy += 1
                return served, live is None
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._starting.pop(key, None)  # one lock per prompt ever seen, otherwise

    def _release(self, pooled: PooledProcess) -> None:
        pooled.busy -= 1
        self.processes.touch(pooled)

    # --------------------------------------------------------------- sessions

    def _hold(self, session_id: str, pooled: PooledProcess) -> None:
        previous = self.home.get(session_id)
        if previous is not None and previous is not pooled:
            previous.sessions.discard(session_id)
            self.processes.touch(previous)
        self.home[session_id] = pooled
        pooled.sessions.add(session_id)
        self.processes.touch(pooled)
        self.context.place_session(session_id, pooled.link)

    def _drop(self, session_id: str) -> None:
        pooled = self.home.pop(session_id, None)
        if pooled is not None:
            pooled.sessions.discard(session_id)
            self.processes.touch(pooled)
            self.context.unplace_session(session_id)

    def _gone(self, pooled: PooledProcess) -> None:
        """A process is gone: the sessions it held are live nowhere now."""
        for session_id in list(pooled.sessions):
            if self.home.get(session_id) is pooled:
                del self.home[session_id]
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
                self.context.start_soon(self.processes.prepare_spare, pooled.prompt.mode)

    async def _open(self, call: LifecycleCall) -> Reply:
        """session/new, session/fork: the new session lives in its prompt's process."""

        async def serve(pooled: PooledProcess) -> Opened:
            if call.method == "session/fork":
                for problem in self.fork_limits(call.previous, call.prompt):
                    self.log.warning("%s of session %s: %s", call.method, call.session_id, problem)
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
            or not self.processes.runs(holder)
        ):
            return False
        await self.processes.stop(
            holder, f"it still holds session {session_id}, reopened elsewhere"
        )
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
                if self.processes.runs(pooled)
            }
            if holder is not None:
                self._closed_in[session_id] = holder

    session_close = _end
    session_delete = _end

    async def aclose(self) -> None:
        """Stop every process the pool started that still runs, and remove every file."""
        await self.processes.aclose()
