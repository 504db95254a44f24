"""The agent processes of one pool adapter: which run, how they start, and when they stop.

:class:`PoolProcesses` owns the processes behind a :class:`~acp_bridge.pool.PoolAdapter`
(the adapter owns which session lives in which of them):

* the table of running processes by prompt fingerprint (``None``: the primary, started by
  the bridge) and the one *spare* process, started ahead of the next new prompt of its
  mode and claimed by it (``spare: true``);
* starting a process for a prompt, with the arguments, environment and files its
  :class:`ProcessRecipe` (the adapter) makes in a private folder
  (:class:`~acp_bridge.supervision.private_dirs.PrivateDir`: named to a watchdog from its
  creation; what a dead bridge with the same adapter left is swept at start);
* the bound: at most ``max_processes`` at once, the primary and a spare included, a place
  reserved while a start is under way; room is made by stopping the spare first, then
  the longest-idle process; past that, :data:`AT_CAPACITY`;
* the idle clock of each process and the reaper that stops a process (or an unclaimed
  spare) idle for ``idle_timeout``;
* dropping a process that exited on its own, and stopping every one at shutdown; each
  process's private folder goes with it.

The adapter marks a process busy while a lifecycle call uses it and adds or removes its
sessions, then calls :meth:`PoolProcesses.touch`; it is told through ``on_gone`` when a
process is gone, with the sessions it held.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import trio
from pydantic import BaseModel, ConfigDict, Field

from acp_bridge.adapter import AdapterContext, AgentError, AgentExited, AgentLink, Reply
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.supervision.agent_process import AgentStartError
from acp_bridge.supervision.agent_watchdog import Watchdog
from acp_bridge.supervision.private_dirs import PrivateDir, sweep
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS

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


class PromptRefused(Exception):
    """No process can serve this prompt; the message is for the client."""

    def __init__(self, message: str, data: Any = None, code: int = INTERNAL_ERROR) -> None:
        super().__init__(message)
        self.data = data
        self.code = code

    def reply(self) -> Reply:
        return Reply.failure(self.code, str(self), self.data)


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


def write_prompt_file(private: PrivateDir, name: str, text: str, mode: str, reader: str) -> Path:
    """Write ``text``, a ``mode`` prompt as agent ``reader`` is to read it, to the file
    ``name`` of ``private``; its path.

    A lone surrogate is valid in JSON text but has no UTF-8 form: the client gets
    ``-32602`` naming the field, not a failed start, and the folder goes with the process
    it was made for (a spare being filled is stopped, as for any refused prompt).
    """
    try:
        return private.write(name, text)
    except UnicodeEncodeError as exc:
        raise PromptRefused(
            f"The {mode} system prompt contains a lone surrogate (position {exc.start}), "
            f"which cannot be written to the UTF-8 file {reader} reads.",
            {"field": "systemPrompt.content"},
            INVALID_PARAMS,
        ) from None


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


class ProcessRecipe(Protocol):
    """How a prompt becomes a process: what :class:`~acp_bridge.pool.PoolAdapter` says."""

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig: ...

    def spares_for(self, mode: str) -> bool: ...

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig: ...

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None: ...

    def private_root(self) -> Path | None: ...


class PoolProcesses:
    """The processes one pool adapter runs (see the module docstring)."""

    def __init__(
        self,
        context: AdapterContext,
        options: PoolOptions,
        recipe: ProcessRecipe,
        *,
        label: str,
        prefix: str,
        log: logging.Logger,
        on_gone: Callable[[PooledProcess], None],
    ) -> None:
        self.context = context
        self.options = options
        self.recipe = recipe
        self.label = label
        """The agent as messages to the client name it."""
        self.prefix = prefix
        """How this adapter's private folders are named (``acp-bridge-<adapter>-``)."""
        self.log = log
        self.on_gone = on_gone
        """Told of a process that is gone, with the sessions it held."""
        self.by_key: dict[str | None, PooledProcess] = {}
        """Prompt fingerprint (None: the primary) -> its process."""
        self.stopping = False
        self._spare: PooledProcess | None = None
        """A started process no prompt has claimed yet (see ``PoolAdapter.spare_config``)."""
        self._spare_starting: tuple[str, trio.Event] | None = None
        """The mode of a spare being started, and the event set when that start ends."""
        self._changed = trio.Event()
        self._reaper_wakes_at = -math.inf
        """When the reaper wakes unless ``_changed`` is set (-inf: it does not sleep)."""
        self._reaper_running = False
        self._reserved = 0
        self._keeper: Watchdog | None = None
        """The watchdog of the private folders: started with the first one."""
        self._sweep()

    # ------------------------------------------------------------------ the table

    def primary(self) -> PooledProcess:
        pooled = self.by_key.get(None)
        if pooled is None or pooled.link is not self.context.primary:
            pooled = PooledProcess(self.context.primary, None)
            self.by_key[None] = pooled
        return pooled

    def live(self, key: str | None) -> PooledProcess | None:
        """The running process of a prompt key, if any (the primary's for None)."""
        if key is None:
            return self.primary()
        pooled = self.by_key.get(key)
        if pooled is not None and pooled.link.closed:
            self._forget(pooled)
            return None
        return pooled

    def runs(self, pooled: PooledProcess) -> bool:
        """Whether ``pooled`` is a prompt's process of this pool still (the primary too)."""
        return self.by_key.get(pooled.key) is pooled

    def touch(self, pooled: PooledProcess) -> None:
        """Start or clear the idle clock of a process after its sessions changed.

        The reaper is woken only when this makes a deadline earlier than the one it sleeps
        until: a process that became busy is looked at again at that time anyway, and every
        lifecycle call touches its process, so waking it each time would cost a scheduling
        round per call."""
        if not pooled.reapable:
            pooled.idle_since = None
            return
        now = pooled.idle_since = trio.current_time()
        if now + self.options.idle_timeout < self._reaper_wakes_at:
            self._changed.set()

    # --------------------------------------------------------------- processes

    def _sweep(self) -> None:
        """Remove the private folders a dead bridge with this adapter left."""
        try:
            removed = sweep(self.prefix, self.recipe.private_root())
        except OSError as exc:
            self.log.warning("could not look for private folders a stopped bridge left: %s", exc)
            return
        if removed:
            self.log.info("removed %d private folder(s) a stopped bridge left", removed)

    async def start(self, prompt: SystemPrompt) -> PooledProcess:
        """A process serving ``prompt``: the spare claimed, or a new one started."""
        if self.stopping:
            raise PromptRefused("The bridge is shutting down.")
        claimed = await self._claim_spare(prompt)
        if claimed is not None:
            return claimed
        private = self._private_dir()
        try:
            config = self.recipe.process_config(prompt, private)
            check_process_config(config, prompt, self.label)
            await self._make_room()
            try:
                link = await self.context.spawn_agent(
                    list(config.args), dict(config.env), [str(private.path)]
                )
            except (AgentStartError, AgentError, AgentExited) as exc:
                raise PromptRefused(
                    f"The bridge could not start a {self.label} process for this "
                    f"system prompt: {exc}"
                ) from exc
            finally:
                self._reserved -= 1
        except BaseException:
            private.remove()
            raise
        pooled = PooledProcess(link, prompt, private)
        self.by_key[pooled.key] = pooled
        self.log.info("%s serves %s prompt %s", link.name, prompt.mode, pooled.key)
        self.context.start_soon(self._watch_exit, pooled)
        self._start_reaper()
        return pooled

    def _private_dir(self) -> PrivateDir:
        """A new private folder, named to the watchdog before anything is written in it."""
        if self._keeper is None:
            self._keeper = Watchdog.start()
        return PrivateDir.create(self.prefix, self.recipe.private_root(), self._keeper)

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
            self.recipe.fill_spare(prompt, spare.private)
        except BaseException:
            # It may hold part of a refused prompt now: it serves nothing else.
            self.context.start_soon(self.stop, spare, "its prompt was refused")
            raise
        spare.prompt, spare.spare_mode = prompt, None
        self.by_key[spare.key] = spare
        self.log.info("%s (spare) serves %s prompt %s", spare.link.name, prompt.mode, spare.key)
        return spare

    async def prepare_spare(self, mode: str) -> None:
        """Start a spare process for the next new ``mode`` prompt, if the agent allows one
        and a place under ``max_processes`` is free (no process is stopped for it)."""
        current = self._spare
        if (
            not self.options.spare
            or not self.recipe.spares_for(mode)
            or self.stopping
            or self._spare_starting is not None
            or (current is not None and current.spare_mode == mode)
        ):
            return
        if current is not None:
            await self.stop(current, f"a spare for {mode} prompts replaces it")
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
            self.log.info("no spare %s process: %s", self.label, exc)
            return
        try:
            config = self.recipe.spare_config(mode, private)
            link = await self.context.spawn_agent(
                list(config.args), dict(config.env), [str(private.path)]
            )
        except (PromptRefused, AgentStartError, AgentError, AgentExited, OSError) as exc:
            private.remove()
            self.log.info("no spare %s process: %s", self.label, exc)
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
        if self.stopping:
            await self.stop(spare, "shutdown")

    # ------------------------------------------------------------- stopping

    def _forget(self, pooled: PooledProcess, *, keep_files: bool = False) -> None:
        if self._spare is pooled:
            self._spare = None
        elif self.by_key.get(pooled.key) is pooled:
            del self.by_key[pooled.key]
        self.on_gone(pooled)
        if pooled.private is not None and not keep_files:
            pooled.private.remove()
        self._changed.set()

    async def stop(self, pooled: PooledProcess, why: str) -> None:
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
        claimed = pooled.prompt is not None and self.by_key.get(pooled.key) is pooled
        if self._spare is pooled or claimed:
            # The relay logs how it exited; a crash is a warning there.
            self.log.info("%s exited; its sessions are gone", pooled.link.name)
            self._forget(pooled)

    def _running(self) -> int:
        """Processes running or being started, the primary and a spare included."""
        spare = 0 if self._spare is None else 1
        return 1 + sum(1 for key in self.by_key if key is not None) + spare + self._reserved

    async def _make_room(self) -> None:
        """Reserve a place under ``max_processes``: stop the longest-idle process, or refuse."""
        while True:
            for pooled in list(self.by_key.values()):
                if pooled.prompt is not None and pooled.link.closed:
                    self._forget(pooled)
            if self._running() < self.options.max_processes:
                self._reserved += 1
                return
            if self._spare is not None:
                await self.stop(self._spare, "making room for another prompt")
                continue
            idle = [p for p in self.by_key.values() if p.reapable]
            if not idle:
                raise PromptRefused(
                    f"The bridge is at capacity: it runs at most {self.options.max_processes} "
                    f"{self.label} processes, one per distinct system prompt, and each "
                    "holds a live session; close a session or reuse a prompt.",
                    {"maxProcesses": self.options.max_processes},
                    AT_CAPACITY,
                )
            oldest = min(idle, key=lambda p: p.idle_since if p.idle_since is not None else 0.0)
            await self.stop(oldest, "making room for another prompt")

    async def _reap_idle(self) -> None:
        """Stop prompt processes that held no live session for ``idle_timeout``."""
        while not self.stopping:
            self._changed = trio.Event()
            deadlines = [
                p.idle_since + self.options.idle_timeout
                for p in self.by_key.values()
                if p.reapable and p.idle_since is not None
            ]
            spare = self._spare
            if spare is not None and spare.idle_since is not None:
                deadlines.append(spare.idle_since + self.options.idle_timeout)
            self._reaper_wakes_at = min(deadlines, default=math.inf)
            with trio.move_on_at(self._reaper_wakes_at):
                await self._changed.wait()
            self._reaper_wakes_at = -math.inf
            now = trio.current_time()
            spare = self._spare
            if (
                spare is not None
                and spare.idle_since is not None
                and now >= spare.idle_since + self.options.idle_timeout
                and not self.stopping
            ):
                await self.stop(spare, "an unclaimed spare, idle")
            for pooled in list(self.by_key.values()):
                expired = (
                    pooled.reapable
                    and pooled.idle_since is not None
                    and now >= pooled.idle_since + self.options.idle_timeout
                )
                if expired and not self.stopping:
                    await self.stop(pooled, "idle")

    async def aclose(self) -> None:
        """Stop every process the pool started that still runs, and remove every file."""
        self.stopping = True
        self._changed.set()
        with trio.CancelScope(shield=True):
            started = [p for key, p in list(self.by_key.items()) if key is not None]
            for pooled in [*started, *([self._spare] if self._spare else [])]:
                await self.stop(pooled, "shutdown")
        keeper, self._keeper = self._keeper, None
        if keeper is not None and self._spare_starting is None:
            keeper.release()
        # Otherwise a spare being started still has its folder: the watchdog removes it
        # when the bridge exits, should the start not end in time for the bridge to.
