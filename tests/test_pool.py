"""The process pool in memory: a fake AdapterContext whose agent processes are objects.

Each test drives a :class:`PoolAdapter` through its lifecycle hooks the way the relay does
and asserts on which fake process got what, what was started and stopped, and which
private files exist. Time is trio's MockClock (``autojump_clock``), so idle reaping runs
without waiting.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing
from adapter_context import Context, ContextWithEnvironment

from acp_bridge import pool_processes
from acp_bridge.adapter import (
    Adapter,
    AdapterContext,
    AgentError,
    AgentLink,
    Delivery,
    LifecycleCall,
    Reply,
)
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import (
    AT_CAPACITY,
    PoolAdapter,
    PrivateDir,
    ProcessConfig,
    PromptRefused,
)
from acp_bridge.supervision.agent_process import AgentStartError
from acp_bridge.supervision.private_dirs import sweep
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, JsonObject

_session_numbers = itertools.count(1)


@dataclass
class FakeProcess:
    """One fake agent process: what it was started with and every request it got."""

    name: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    received: list[tuple[str, JsonObject]] = field(default_factory=list)
    initialize_result: JsonObject | None = None
    closed: bool = False
    has_close: bool = True
    refuse_reopens: int = 0
    """How many reopens to refuse with -32603 (an agent still releasing a closed session)."""
    exited: trio.Event = field(default_factory=trio.Event)

    def exit(self) -> None:
        """The process ends: stopped, or on its own."""
        self.closed = True
        self.exited.set()

    async def wait_closed(self) -> None:
        await self.exited.wait()

    def methods(self) -> list[str]:
        return [method for method, _ in self.received]

    async def request(self, method: str, params: JsonObject) -> Any:
        reply = self.answer(method, params)
        if reply.error is not None:
            raise AgentError(reply.error)
        return reply.result

    async def notify(self, method: str, params: JsonObject) -> None:
        self.received.append((method, params))

    def answer(self, method: str, params: JsonObject) -> Reply:
        self.received.append((method, params))
        if method == "session/new":
            return Reply(result={"sessionId": f"s{next(_session_numbers)}"})
        if method in ("session/load", "session/resume") and self.refuse_reopens:
            self.refuse_reopens -= 1
            return Reply.internal("session still has a live writer")
        if method == "session/close" and not self.has_close:
            return Reply.failure(METHOD_NOT_FOUND, "Method not found")
        return Reply(result={})


@dataclass
class FakeContext:
    """The AdapterContext of the relay, with fake processes."""

    nursery: trio.Nursery
    options: Mapping[str, Any] = field(default_factory=dict)
    processes: list[FakeProcess] = field(default_factory=list)
    stopped: list[FakeProcess] = field(default_factory=list)
    private_files: list[str] = field(default_factory=list)
    """What each process's watchdog would remove should the bridge die."""
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("test-pool"))
    spawn_time: float = 0.0
    """Seconds a process takes to start and answer the replayed initialize."""
    placed: dict[str, AgentLink] = field(default_factory=dict)
    """Where the adapter said each session lives (the router's table)."""

    def __post_init__(self) -> None:
        self._primary = FakeProcess("agent")
        self.processes.append(self._primary)

    @property
    def primary(self) -> AgentLink:
        return self._primary

    def live_sessions(self) -> set[str]:
        return set()

    def agent_environment(self) -> Mapping[str, str]:
        return dict(os.environ)

    async def spawn_agent(
        self,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        private_files: Sequence[str] = (),
    ) -> AgentLink:
        strings = [*extra_args, *(extra_env or {}).keys(), *(extra_env or {}).values()]
        if any("\x00" in value for value in strings):
            # What the relay's spawn says (subprocess's ValueError), as execve would refuse.
            raise AgentStartError("agent", "embedded null byte")
        self.private_files.extend(private_files)
        await trio.sleep(self.spawn_time)
        process = FakeProcess(f"agent-{len(self.processes)}", list(extra_args), extra_env or {})
        process.received.append(("initialize", {"protocolVersion": 1}))  # the replay
        self.processes.append(process)
        return process

    async def stop_agent(self, link: AgentLink) -> None:
        assert isinstance(link, FakeProcess)
        link.exit()
        self.stopped.append(link)

    def place_session(self, session_id: str, link: AgentLink) -> None:
        self.placed[session_id] = link

    def unplace_session(self, session_id: str) -> None:
        self.placed.pop(session_id, None)

    def route(self, session_id: str | None) -> AgentLink:
        """Where the router sends a frame naming ``session_id``: where it was placed, or
        the primary (as for a process that is gone)."""
        link = self.placed.get(session_id) if session_id is not None else None
        return self._primary if link is None or link.closed else link

    def start_soon(self, async_fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        self.nursery.start_soon(async_fn, *args)

    def adapter_options(self, adapter: str) -> Mapping[str, Any]:
        return self.options

    def running(self) -> list[FakeProcess]:
        return [p for p in self.processes if not p.closed]


class FilePool(PoolAdapter):
    """A pool adapter whose agent reads the prompt from a file named in the environment."""

    name = "file-pool"
    agent_label = "fake-agent"
    close_settle_timeout = 2.0

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        if not prompt.text:
            raise PromptRefused("empty", {"field": "systemPrompt.content"}, INVALID_PARAMS)
        path = private.write("prompt.md", prompt.text)
        return ProcessConfig(args=["--mode", prompt.mode], env={"PROMPT_FILE": str(path)})


@dataclass
class FakeCall:
    """A lifecycle call as the relay hands it to a hook."""

    method: str
    params: JsonObject
    link: AgentLink
    prompt: SystemPrompt | None = None
    previous: SystemPrompt | None = None
    session_id: str | None = None
    client_sent_prompt: bool = True
    delivered: str | None = None
    original_params: JsonObject = field(default_factory=dict)

    async def forward(self, link: AgentLink | None = None) -> Reply:
        target = link or self.link
        assert isinstance(target, FakeProcess)
        return target.answer(self.method, self.params)

    def mark_delivered(self, fingerprint: str | None) -> None:
        self.delivered = fingerprint


def append(text: str) -> SystemPrompt:
    return SystemPrompt.of_text("append", text)


def override(text: str) -> SystemPrompt:
    return SystemPrompt.of_text("override", text)


@dataclass
class Pool:
    adapter: FilePool
    context: FakeContext

    def call(self, method: str, session_id: str | None = None, **kw: Any) -> FakeCall:
        params: JsonObject = {} if session_id is None else {"sessionId": session_id}
        routed = self.context.route(session_id)
        return FakeCall(method, params, routed, session_id=session_id, **kw)

    async def new(self, prompt: SystemPrompt | None = None) -> str:
        reply = await self.adapter.session_new(self.call("session/new", prompt=prompt))
        assert reply.ok, reply.error
        session_id: str = reply.result["sessionId"]
        return session_id

    async def close(self, session_id: str) -> Reply:
        return await self.adapter.session_close(self.call("session/close", session_id))

    def holder(self, session_id: str) -> FakeProcess:
        link = self.context.route(session_id)
        assert isinstance(link, FakeProcess)
        return link

    def private_dirs(self) -> list[Path]:
        running = self.adapter.processes.by_key.values()
        return [p.private.path for p in running if p.private is not None]


@asynccontextmanager
async def open_pool(
    adapter_class: type[FilePool] = FilePool, spawn_time: float = 0.0, **options: Any
) -> AsyncIterator[Pool]:
    async with trio.open_nursery() as nursery:
        context = FakeContext(nursery, options, spawn_time=spawn_time)
        adapter = adapter_class(context)
        try:
            yield Pool(adapter, context)
        finally:
            await adapter.aclose()
            nursery.cancel_scope.cancel()


class Keeper:
    """Stands in for the watchdog process the pool names its private folders to (whose
    own work, removing them after a SIGKILL, tests/test_sigkill.py shows with processes):
    what is named to it and not taken back yet."""

    started: list[Keeper]

    def __init__(self) -> None:
        self.owned: set[str] = set()
        self.released = False

    @classmethod
    def start(cls) -> Keeper:
        keeper = cls()
        cls.started.append(keeper)
        return keeper

    def own(self, path: str) -> None:
        assert not self.released
        self.owned.add(path)

    def disown(self, path: str) -> None:
        self.owned.discard(path)

    def release(self) -> None:
        self.released = True

    def discard(self) -> None:
        self.released = True

    def abandon(self) -> None:
        self.released = True


@pytest.fixture
def private_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Private directories go under ``tmp_path`` so a test can see every one left; they
    are named to a :class:`Keeper`, not to a watchdog process."""
    root = tmp_path / "private"
    monkeypatch.setattr(FilePool, "private_root", lambda self: root)
    monkeypatch.setattr(Keeper, "started", [], raising=False)
    monkeypatch.setattr(pool_processes, "Watchdog", Keeper)
    yield root


# ----------------------------------------------------------------------------- routing


async def test_each_prompt_gets_one_process_and_sessions_are_routed_to_it(
    private_dirs: Path,
) -> None:
    async with open_pool() as pool:
        plain = await pool.new()
        first = await pool.new(append("A"))
        again = await pool.new(append("A"))
        other = await pool.new(override("A"))  # same text, other mode: another process

        assert pool.holder(plain) is pool.context.primary
        assert pool.holder(first) is pool.holder(again)
        assert len({id(pool.holder(s)) for s in (plain, first, other)}) == 3
        assert "unknown" not in pool.context.placed
        assert set(pool.context.placed) <= {plain, first, again, other}
        # Every started process got the client's initialize first.
        for process in pool.context.processes[1:]:
            assert process.methods()[0] == "initialize"
        assert [p.args for p in pool.context.processes[1:]] == [
            ["--mode", "append"],
            ["--mode", "override"],
        ]


async def test_an_adapter_written_for_route_still_places_its_sessions() -> None:
    """An adapter of the deprecated ``route`` shape keeps working: after each hook, where
    its ``route`` says a session lives is placed for it (the bridge never asks it while
    routing)."""
    with pytest.warns(DeprecationWarning, match="OwnProcesses.route is deprecated"):

        class OwnProcesses(Adapter):
            def __init__(self, context: FakeContext) -> None:
                super().__init__(context)
                self.home: dict[str, AgentLink] = {}

            async def session_new(self, call: LifecycleCall) -> Reply:
                link = await self.context.spawn_agent()
                reply = await call.forward(link)
                self.home[reply.result["sessionId"]] = link
                return reply

            async def session_close(self, call: LifecycleCall) -> Reply:
                assert call.session_id is not None
                self.home.pop(call.session_id, None)
                return await call.forward()

            def route(self, method: str, params: Any) -> AgentLink | None:
                return self.home.get(params.get("sessionId"))

    async with trio.open_nursery() as nursery:
        context = FakeContext(nursery)
        adapter = OwnProcesses(context)
        reply = await adapter.session_new(FakeCall("session/new", {}, context.primary))
        session_id = reply.result["sessionId"]
        spawned = context.processes[1]
        assert context.route(session_id) is spawned
        close = FakeCall("session/close", {"sessionId": session_id}, spawned)
        close.session_id = session_id
        await adapter.session_close(close)
        assert session_id not in context.placed


async def test_the_prompt_reaches_a_private_file_named_in_the_environment(
    private_dirs: Path,
) -> None:
    async with open_pool() as pool:
        session = await pool.new(append("secret rules\n"))
        path = Path(pool.holder(session).env["PROMPT_FILE"])
        assert path.read_text() == "secret rules\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert "secret" not in " ".join(pool.holder(session).args)
    assert not path.exists()
    assert list(private_dirs.iterdir()) == []


async def test_a_prompt_the_adapter_refuses_gets_its_error_and_leaves_nothing(
    private_dirs: Path,
) -> None:
    async with open_pool() as pool:
        reply = await pool.adapter.session_new(pool.call("session/new", prompt=append("")))
        assert reply.error == {
            "code": INVALID_PARAMS,
            "message": "empty",
            "data": {"field": "systemPrompt.content"},
        }
        assert len(pool.context.processes) == 1
        assert list(private_dirs.iterdir()) == []


class ArgvPool(FilePool):
    """A pool adapter whose agent reads the prompt from its command line."""

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        return ProcessConfig(args=[f"--prompt={prompt.text}"])


async def test_a_prompt_an_argument_cannot_carry_is_refused_naming_the_block(
    private_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ArgvPool, "private_root", lambda self: private_dirs)
    async with trio.open_nursery() as nursery:
        context = FakeContext(nursery)
        adapter = ArgvPool(context)
        prompt = SystemPrompt.of_text("append", "fine", "a\x00b")
        call = FakeCall("session/new", {}, context.primary, prompt=prompt)
        reply = await adapter.session_new(call)
        await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert reply.error is not None and reply.error["code"] == INVALID_PARAMS
    assert reply.error["data"] == {"field": "systemPrompt.content[1].text"}
    assert len(context.processes) == 1
    assert list(private_dirs.iterdir()) == []


async def test_reopen_under_another_prompt_closes_the_session_where_it_was(
    private_dirs: Path,
) -> None:
    async with open_pool() as pool:
        session = await pool.new(append("old"))
        old = pool.holder(session)
        call = pool.call("session/load", session, prompt=append("new"), previous=append("old"))
        assert (await pool.adapter.session_load(call)).ok
        new = pool.holder(session)
        assert new is not old
        assert ("session/close", {"sessionId": session}) in old.received
        assert ("session/load", {"sessionId": session}) in new.received
        # Reopened without a prompt: back to the primary.
        call = pool.call("session/resume", session, prompt=None, previous=append("new"))
        assert (await pool.adapter.session_resume(call)).ok
        assert pool.holder(session) is pool.context.primary


async def test_an_agent_without_session_close_still_moves_the_session(
    private_dirs: Path,
) -> None:
    async with open_pool() as pool:
        pool.context.processes[0].has_close = False
        session = await pool.new()
        call = pool.call("session/load", session, prompt=override("X"))
        assert (await pool.adapter.session_load(call)).ok
        assert pool.holder(session) is not pool.context.primary


class LimitedPool(FilePool):
    """A pool adapter whose agent keeps the prompt a session was created with."""

    name = "limited-pool"

    @classmethod
    def reopen_limits(cls, previous: SystemPrompt | None, prompt: SystemPrompt | None) -> list[str]:
        if previous is None or prompt is None or previous == prompt:
            return []
        return ["the agent keeps the prompt the session was created with"]

    @classmethod
    def fork_limits(cls, parent: SystemPrompt | None, prompt: SystemPrompt | None) -> list[str]:
        if parent is None or prompt is None or parent == prompt:
            return []
        return ["the fork keeps its parent's prompt"]


@pytest.mark.parametrize("method", ["session/load", "session/resume"])
async def test_a_changed_prompt_the_agent_cannot_apply_is_logged(
    private_dirs: Path, caplog: pytest.LogCaptureFixture, method: str
) -> None:
    # Spec §6: applied where the agent can; where it cannot, the bridge says so on stderr.
    caplog.set_level(logging.WARNING)
    async with open_pool(LimitedPool) as pool:
        session = await pool.new(append("old"))
        hook = (
            pool.adapter.session_load if method == "session/load" else pool.adapter.session_resume
        )
        same = pool.call(method, session, prompt=append("old"), previous=append("old"))
        assert (await hook(same)).ok
        assert caplog.records == []
        changed = pool.call(method, session, prompt=append("new"), previous=append("old"))
        assert (await hook(changed)).ok
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"{method} of session {session}: the agent keeps the prompt the session was created with"
    )


async def test_a_fork_the_agent_cannot_give_its_own_prompt_is_logged(
    private_dirs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with open_pool(LimitedPool) as pool:
        parent = await pool.new(append("old"))
        same = pool.call("session/fork", parent, prompt=append("old"), previous=append("old"))
        assert (await pool.adapter.session_fork(same)).ok
        assert caplog.records == []
        changed = pool.call("session/fork", parent, prompt=append("new"), previous=append("old"))
        assert (await pool.adapter.session_fork(changed)).ok
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert (
        record.getMessage()
        == f"session/fork of session {parent}: the fork keeps its parent's prompt"
    )


async def test_a_reopen_refused_right_after_a_close_is_retried(
    private_dirs: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_pool() as pool:
        session = await pool.new(append("A"))
        holder = pool.holder(session)
        assert (await pool.close(session)).ok
        holder.refuse_reopens = 3
        call = pool.call("session/load", session, prompt=append("A"))
        assert (await pool.adapter.session_load(call)).ok
        assert holder.methods().count("session/load") == 4
        # Long after a close, a refusal is the agent's answer, not a race.
        await pool.close(session)
        await trio.sleep(5)
        holder.refuse_reopens = 1
        reply = await pool.adapter.session_load(
            pool.call("session/load", session, prompt=append("A"))
        )
        assert reply.error is not None and reply.error["code"] == INTERNAL_ERROR


async def test_closes_are_remembered_only_for_the_settle_window(
    private_dirs: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_pool() as pool:
        for _ in range(20):
            assert (await pool.close(await pool.new(append("A")))).ok
            await trio.sleep(1)  # FilePool's settle window is 2 s
        assert len(pool.adapter._closed_at) <= 2
        # Nor is a start lock kept for every prompt ever seen.
        for n in range(20):
            await pool.close(await pool.new(append(f"prompt {n}")))
        assert pool.adapter._starting == {}


# --------------------------------------------------------------------- process lifetime


async def test_a_process_without_sessions_is_reaped_after_the_idle_timeout(
    private_dirs: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_pool(idle_timeout=10) as pool:
        kept = await pool.new(append("kept"))
        closed = await pool.new(append("closed"))
        kept_process, closed_process = pool.holder(kept), pool.holder(closed)
        await pool.close(closed)
        await trio.sleep(9)
        assert not closed_process.closed
        await trio.sleep(2)
        assert closed_process.closed and closed_process in pool.context.stopped
        assert not Path(closed_process.env["PROMPT_FILE"]).exists()
        # A live session keeps its process however long it idles.
        await trio.sleep(100)
        assert not kept_process.closed and pool.context.primary.closed is False
        # The prompt used again: a new process.
        again = await pool.new(append("closed"))
        assert pool.holder(again) is not closed_process


class TaskSteps(trio.abc.Instrument):
    """How often each task was resumed by the scheduler."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] = self.steps.get(task.name, 0) + 1


async def test_a_session_in_a_running_prompts_process_costs_no_trip_to_the_scheduler(
    private_dirs: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The usual session/new of a seen prompt: its process runs, so nothing waits (no lock
    # taken) and no pool task is woken (the reaper sleeps until the earliest idle deadline,
    # which a busy process does not bring forward).
    async with open_pool(idle_timeout=10) as pool:
        first = await pool.new(append("A"))
        idle = await pool.new(append("idle"))
        idle_process = pool.holder(idle)
        await pool.close(idle)  # the reaper now sleeps until this one's deadline
        await trio.testing.wait_all_tasks_blocked()
        steps = TaskSteps()
        trio.lowlevel.add_instrument(steps)
        try:
            sessions = [await pool.new(append("A")) for _ in range(10)]
            assert steps.steps == {}  # the calls never yielded
            await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert not [name for name in steps.steps if "_reap_idle" in name]
        assert {id(pool.holder(s)) for s in sessions} == {id(pool.holder(first))}
        # The idle process is still reaped at its deadline.
        await trio.sleep(11)
        assert idle_process.closed and not pool.holder(first).closed


async def test_past_the_maximum_a_new_prompt_gets_a_clear_error(private_dirs: Path) -> None:
    async with open_pool(max_processes=2) as pool:
        first = await pool.new(append("one"))
        reply = await pool.adapter.session_new(pool.call("session/new", prompt=append("two")))
        assert reply.error is not None
        # Not a fault of the bridge's: a bound the client can act on.
        assert reply.error["code"] == AT_CAPACITY == -32029
        assert "at capacity" in reply.error["message"]
        assert "at most 2 fake-agent processes" in reply.error["message"]
        assert reply.error["data"] == {"maxProcesses": 2}
        assert len(pool.context.processes) == 2
        assert len(pool.private_dirs()) == 1
        # A prompt already running, and sessions without a prompt, still work.
        also = await pool.new(append("one"))
        await pool.new()
        # Once the first prompt's process holds no session it makes room.
        for session in (first, also):
            await pool.close(session)
        second = await pool.new(append("two"))
        assert pool.holder(second).args == ["--mode", "append"]
        assert len(pool.context.running()) == 2


async def test_a_process_that_exits_on_its_own_is_dropped_with_its_files(
    private_dirs: Path, mock_clock: trio.testing.MockClock
) -> None:
    """Dropped as it exits: the clock stands still (nothing polls)."""
    async with open_pool() as pool:
        session = await pool.new(override("X"))
        process = pool.holder(session)
        await trio.testing.wait_all_tasks_blocked()  # the pool watches it
        assert list(private_dirs.iterdir()) != []
        process.exit()  # crashed
        await trio.testing.wait_all_tasks_blocked()
        assert session not in pool.context.placed
        assert list(private_dirs.iterdir()) == []
        again = await pool.new(override("X"))
        assert pool.holder(again) is not process


async def test_shutdown_stops_every_process_and_removes_every_file(private_dirs: Path) -> None:
    async with open_pool() as pool:
        await pool.new()
        for text in ("a", "b", "c"):
            await pool.new(append(text))
        assert len(pool.context.running()) == 4
    started = pool.context.processes[1:]
    assert all(p.closed for p in started) and sorted(
        p.name for p in pool.context.stopped
    ) == sorted(p.name for p in started)
    assert list(private_dirs.iterdir()) == []
    # The primary is the relay's to stop.
    assert not pool.context.processes[0].closed


async def test_opened_runs_per_session_before_the_client_gets_the_response(
    private_dirs: Path,
) -> None:
    seen: list[tuple[str, str, str | None]] = []

    class ModePool(FilePool):
        async def opened(
            self, link: AgentLink, session_id: str, prompt: SystemPrompt | None
        ) -> None:
            seen.append((link.name, session_id, prompt.text if prompt else None))
            if prompt is not None and prompt.text == "refuse":
                raise PromptRefused("no mode for this prompt")

    async with trio.open_nursery() as nursery:
        context = FakeContext(nursery)
        pool = Pool(ModePool(context), context)
        session = await pool.new(append("A"))
        call = pool.call("session/load", session, prompt=append("B"))
        assert (await pool.adapter.session_load(call)).ok
        reply = await pool.adapter.session_new(pool.call("session/new", prompt=append("refuse")))
        assert reply.error is not None and reply.error["message"] == "no mode for this prompt"
        await pool.adapter.aclose()
        nursery.cancel_scope.cancel()
    assert [(name, text) for name, _, text in seen] == [
        ("agent-1", "A"),
        ("agent-2", "B"),
        ("agent-3", "refuse"),
    ]
    assert seen[0][1] == seen[1][1] == session


async def test_invalid_options_name_the_adapter_and_the_key() -> None:
    async with trio.open_nursery() as nursery:
        with pytest.raises(ValueError, match=r"bridge.adapter_options.file-pool: max_processes"):
            FilePool(FakeContext(nursery, {"max_processes": 0}))


def test_a_sweep_removes_what_a_dead_bridge_left_and_never_a_folder_in_use(
    tmp_path: Path,
) -> None:
    live = PrivateDir.create("acp-bridge-t-", tmp_path)
    live.write("prompt.md", "x")
    left = tmp_path / "acp-bridge-t-left"
    (left / "sub").mkdir(parents=True)
    (left / "sub" / "prompt.md").write_text("x")
    (tmp_path / "acp-bridge-other-left").mkdir()
    (tmp_path / "acp-bridge-t-file").write_text("not a folder")
    assert sweep("acp-bridge-t-", tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.path.name, "acp-bridge-other-left", "acp-bridge-t-file"]
    )
    live.remove()
    assert sweep("acp-bridge-t-", tmp_path) == 0


def test_every_folder_inside_a_private_dir_is_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    # copilot's .github/instructions/: the intermediate folder was made with the umask's
    # mode (0755) inside the 0700 one.
    private = PrivateDir.create("t-", tmp_path)
    old = os.umask(0o022)
    try:
        made = [
            private.write("a/b/c.md", "x").parent,
            private.mkdir("d/e/f"),
            private.link("g/h/link", tmp_path).parent,
        ]
    finally:
        os.umask(old)
    folders = {private.path}
    for folder in made:
        folders.update(p for p in [folder, *folder.parents] if p.is_relative_to(private.path))
    assert len(folders) == 8  # the dir, a, a/b, d, d/e, d/e/f, g, g/h
    assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in folders} == {
        f.name: "0o700" for f in folders
    }
    private.remove()


def test_private_dir_refuses_paths_outside_it(tmp_path: Path) -> None:
    private = PrivateDir.create("t-", tmp_path)
    for name in ("../x", "/etc/x", "a/../../x", ""):
        with pytest.raises(ValueError):
            private.write(name, "x")
    nested = private.write("a/b/c.md", "x")
    assert stat.S_IMODE(nested.parent.stat().st_mode) == 0o700
    with pytest.raises(FileExistsError):
        private.write("a/b/c.md", "again")  # never rewritten in place
    private.remove()
    assert not private.path.exists()


# ----------------------------------------------------------------------------- spares


class SparePool(FilePool):
    """A FilePool whose agent reads its prompt file only when a session starts, in append
    mode: a process can be started before the prompt is known."""

    spare_modes = frozenset({"append"})

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        return ProcessConfig(args=["--mode", mode], env={"PROMPT_FILE": str(private.path / "p")})

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        if not prompt.text:
            raise PromptRefused("empty", {"field": "systemPrompt.content"}, INVALID_PARAMS)
        private.write("p", prompt.text)


async def test_a_spare_started_after_a_new_prompt_serves_the_next_one_with_its_text(
    private_dirs: Path,
) -> None:
    async with open_pool(SparePool, spare=True) as pool:
        first = await pool.new(append("one"))
        await trio.testing.wait_all_tasks_blocked()
        _, one, spare = pool.context.processes
        assert pool.holder(first) is one and not spare.closed
        # Started and initialized, its folder private and named to the watchdog, no text.
        prompt_file = Path(spare.env["PROMPT_FILE"])
        assert spare.methods() == ["initialize"]
        assert not prompt_file.exists()
        assert stat.S_IMODE(prompt_file.parent.stat().st_mode) == 0o700
        assert str(prompt_file.parent) in pool.context.private_files

        second = await pool.new(append("two"))
        assert pool.holder(second) is spare
        assert prompt_file.read_text() == "two"
        assert stat.S_IMODE(prompt_file.stat().st_mode) == 0o600
        assert spare.methods() == ["initialize", "session/new"]
        # Its prompt's process from now on; the next spare is started.
        assert pool.holder(await pool.new(append("two"))) is spare
        await trio.testing.wait_all_tasks_blocked()
        assert len(pool.context.running()) == 4
        assert "two" not in " ".join(spare.args)
    assert all(p.closed for p in pool.context.processes[1:])
    assert list(private_dirs.iterdir()) == []


async def test_only_a_mode_the_agent_reads_lazily_gets_a_spare(private_dirs: Path) -> None:
    async with open_pool(SparePool, spare=True) as pool:
        await pool.new(override("one"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(pool.context.processes) == 2
        await pool.new(append("two"))
        await trio.testing.wait_all_tasks_blocked()
        spare = pool.context.processes[-1]
        # An override prompt does not take the append spare.
        third = await pool.new(override("three"))
        assert pool.holder(third) is not spare and spare.methods() == ["initialize"]
    async with open_pool(FilePool, spare=True) as pool:
        await pool.new(append("one"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(pool.context.processes) == 2
    async with open_pool(SparePool) as pool:  # spares are asked for
        await pool.new(append("one"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(pool.context.processes) == 2


async def test_a_spare_takes_only_a_free_place_and_is_the_first_to_make_room(
    private_dirs: Path,
) -> None:
    async with open_pool(SparePool, spare=True, max_processes=2) as pool:
        await pool.new(append("one"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(pool.context.processes) == 2  # no place left for a spare
    async with open_pool(SparePool, spare=True, max_processes=3) as pool:
        one = await pool.new(append("one"))
        await trio.testing.wait_all_tasks_blocked()
        spare = pool.context.processes[-1]
        other = await pool.new(override("other"))
        assert spare.closed and spare in pool.context.stopped
        assert len(pool.context.running()) == 3
        # Every place holds a live session: the limit answers as before.
        reply = await pool.adapter.session_new(pool.call("session/new", prompt=append("new")))
        assert reply.error is not None and reply.error["code"] == AT_CAPACITY
        assert {pool.holder(one).name, pool.holder(other).name} == {
            p.name for p in pool.context.running()[1:]
        }
        assert len(list(private_dirs.iterdir())) == 2


async def test_an_unclaimed_spare_is_stopped_after_the_idle_timeout(
    private_dirs: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_pool(SparePool, spare=True, idle_timeout=10) as pool:
        kept = await pool.new(append("kept"))
        await trio.testing.wait_all_tasks_blocked()
        spare = pool.context.processes[-1]
        await trio.sleep(9)
        assert not spare.closed
        await trio.sleep(2)
        assert spare.closed and spare in pool.context.stopped
        assert not pool.holder(kept).closed
        assert len(list(private_dirs.iterdir())) == 1


async def test_a_refused_prompt_stops_the_spare_it_was_written_to(private_dirs: Path) -> None:
    async with open_pool(SparePool, spare=True) as pool:
        await pool.new(append("one"))
        await trio.testing.wait_all_tasks_blocked()
        spare = pool.context.processes[-1]
        reply = await pool.adapter.session_new(pool.call("session/new", prompt=append("")))
        assert reply.error is not None and reply.error["code"] == INVALID_PARAMS
        await trio.testing.wait_all_tasks_blocked()
        assert spare.closed and spare.methods() == ["initialize"]
        assert len(list(private_dirs.iterdir())) == 1


async def test_a_spare_that_exits_on_its_own_is_dropped_with_its_folder(
    private_dirs: Path,
) -> None:
    async with open_pool(SparePool, spare=True) as pool:
        await pool.new(append("one"))
        await trio.testing.wait_all_tasks_blocked()
        spare = pool.context.processes[-1]
        spare.exit()
        await trio.testing.wait_all_tasks_blocked()
        assert len(list(private_dirs.iterdir())) == 1
        second = await pool.new(append("two"))
        assert pool.holder(second) is not spare


async def test_a_new_prompt_waits_for_the_spare_being_started_rather_than_start_another(
    private_dirs: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_pool(SparePool, spare=True, spawn_time=5.0) as pool:
        await pool.new(append("one"))
        await trio.sleep(1)  # the spare is on its way
        started = trio.current_time()
        second = await pool.new(append("two"))
        assert trio.current_time() - started == 4.0
        spare = pool.context.processes[2]
        assert pool.holder(second) is spare
        assert Path(spare.env["PROMPT_FILE"]).read_text() == "two"


async def test_shutdown_while_a_spare_starts_leaves_no_process_or_folder(
    private_dirs: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_pool(SparePool, spare=True, spawn_time=5.0) as pool:
        await pool.new(append("one"))
        await trio.sleep(1)
    await trio.sleep(10)
    assert all(p.closed for p in pool.context.processes[1:])
    assert list(private_dirs.iterdir()) == []


async def test_a_spare_whose_folder_cannot_be_made_is_left_out_and_the_bridge_goes_on(
    private_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_pool(SparePool, spare=True) as pool:
        await pool.new(append("one"))

        def full(*args: Any, **kwargs: Any) -> PrivateDir:
            raise OSError(28, "No space left on device")

        # Before the spare's background start runs: its folder cannot be made.
        with monkeypatch.context() as patch:
            patch.setattr(PrivateDir, "create", full)
            await trio.testing.wait_all_tasks_blocked()
        assert len(pool.context.processes) == 2
        second = await pool.new(append("two"))
        assert pool.holder(second) is pool.context.processes[2]


# ------------------------------------------------------------- what a subclass gets


class AppendOnlyPool(SparePool):
    """An agent with no way to replace its own prompt, whose processes are made the way a
    claimed spare is (PoolAdapter's own process_config)."""

    append_only = True
    process_config = PoolAdapter.process_config


async def test_an_append_only_agent_is_offered_append_and_refused_override_by_the_pool(
    private_dirs: Path,
) -> None:
    async with open_pool(AppendOnlyPool) as pool:
        assert pool.adapter.delivery({}) == Delivery(append=True, override=False)
        reply = await pool.adapter.session_new(pool.call("session/new", prompt=override("x")))
        assert reply.error == {
            "code": INVALID_PARAMS,
            "message": "fake-agent offers no way to replace its own system prompt; "
            "use mode append.",
            "data": {"field": "systemPrompt.mode"},
        }
        assert len(pool.context.processes) == 1
        assert list(private_dirs.iterdir()) == []
        # An append prompt's process gets the spare's configuration and the prompt's file.
        process = pool.holder(await pool.new(append("rules")))
        assert process.args == ["--mode", "append"]
        assert Path(process.env["PROMPT_FILE"]).read_text() == "rules"


def test_the_agents_own_variable_is_read_and_one_the_bridge_gives_the_prompt_in_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROMPT_LAYER", "/bridge/own.json")
    told = FilePool(cast(AdapterContext, ContextWithEnvironment({"PROMPT_LAYER": "/preset.json"})))
    assert told.agent_variable("PROMPT_LAYER") == "/preset.json"
    with pytest.raises(PromptRefused) as refused:
        told.refuse_if_set("PROMPT_LAYER", "the agent's global config file")
    assert str(refused.value) == (
        "The bridge gives fake-agent a system prompt through PROMPT_LAYER, which is already "
        "set for the agent (/preset.json); move that configuration to the agent's global "
        "config file, or unset PROMPT_LAYER."
    )
    assert (refused.value.code, refused.value.data) == (
        INTERNAL_ERROR,
        {"variable": "PROMPT_LAYER"},
    )
    # A context that cannot say: the bridge's own environment, which the agent inherits.
    untold = FilePool(cast(AdapterContext, Context()))
    assert untold.agent_variable("PROMPT_LAYER") == "/bridge/own.json"
    unset = FilePool(cast(AdapterContext, ContextWithEnvironment({})))
    unset.refuse_if_set("PROMPT_LAYER", "elsewhere")
