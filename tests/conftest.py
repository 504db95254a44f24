"""Shared fixtures: a bridge in front of ``tests/fake_agent.py``, spoken to in raw lines.

``open_bridge`` starts ``python -m acp_bridge`` (forked from a process that has already
imported the bridge: ``preloaded``) with a throw-away config and session store,
gives the test the raw byte streams (tests assert on exact bytes), and on the way out makes
sure no process it started is left running, whatever the test did. ``open_memory_bridge``
gives the same streams with no process: the runtime in this process, configured from the
same file, in front of the fake agent run as a coroutine.
"""

from __future__ import annotations

import compileall
import gc
import io
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import preloaded
import process_report
import pytest
import trio
import trio.testing
import yaml
from bridge_cli import isolated_env, write_verify_config
from memory_agent import FAKE_PYTHON, ScriptedAgent, ScriptedSpawner

from acp_bridge.commands.cli import make_tracer, resolve_runtime
from acp_bridge.runtime.relay import Bridge
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore
from acp_bridge.supervision import agent_watchdog
from acp_bridge.wire.framing import Line, LineSplitter

# The test modules, rewritten for pytest's assertions, are kept compiled in __pycache__
# as Python keeps modules by default, also where the environment asks for no bytecode
# (PYTHONDONTWRITEBYTECODE): rewriting and compiling the 150 of them again took about 5 s
# of CPU in every run. Only this process writes them; the processes the tests start
# inherit the environment's choice (the bridge's own modules: pytest_sessionstart).
sys.dont_write_bytecode = False

FAKE_AGENT = Path(__file__).with_name("fake_agent.py")
# A young collection after this many new objects, not 700; a full one only at a file's end
# in practice (pytest_collection_finish).
COLLECTOR_THRESHOLDS = (50_000, 20, 100)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        process_report.OPTION,
        action="store_true",
        help="say which tests started an OS process, their share of the time, and the run's CPU",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(process_report.OPTION):
        config.pluginmanager.register(process_report.ProcessReport(), "process-report")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the bridge's modules once, before the tests start bridges as processes.

    Each of those processes imports the bridge from this checkout (an editable install).
    Where the environment has Python write no bytecode (PYTHONDONTWRITEBYTECODE), every
    one of them compiled each module it imports again from its source: 45 ms of CPU more
    per bridge process (330 ms with them compiled). Unchanged modules are not compiled
    again.
    """
    import acp_bridge.adapters

    for package in (acp_bridge.__file__, acp_bridge.adapters.__file__):
        compileall.compile_dir(Path(package).parent, quiet=1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built (the modules, their tests, hypothesis' strategies) lives until
    the end: it is left out of the cyclic collector's passes, which walked all of it at
    every full pass. The collector took 6.1 s of the non-e2e run's CPU; 3.5 s with this,
    2.7 s with the freeze after each file below (timed with ``gc.callbacks``).

    The collector also runs less often: its passes over what a file's tests build (the
    property tests' strategies and examples, the relay fuzz's lines) found little to free
    before the file's end, where it runs anyway. Over the wire and relay files, 1.96 s of
    collections at Python's thresholds (700, 10, 10), 68 of them full, against 1.12 s
    here."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """After a test file's last test, what is still alive joins what was frozen: the next
    files' collections walk only what they made themselves. Garbage is collected first;
    objects frozen are still freed when their last reference goes."""
    yield
    if nextitem is None or nextitem.module is not item.module:  # type: ignore[attr-defined]
        gc.collect()
        gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The server bridges were forked from exits (and is waited for) before the report, and
    the watchdogs of the bridges run in this process have exited, as at a bridge's end."""
    preloaded.end_session()
    agent_watchdog.finish()


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class BridgeLines:
    """A bridge spoken to in raw lines through ``stdin`` and ``stdout``; files the fake
    agent writes live in ``dir``."""

    dir: Path
    sent: bytearray = field(default_factory=bytearray)  # every byte the client wrote
    received: bytearray = field(default_factory=bytearray)  # every byte the client read
    _splitter: LineSplitter = field(default_factory=lambda: LineSplitter(1 << 30))
    _lines: list[bytes] = field(default_factory=list)
    _eof: bool = False
    _send_lock: trio.Lock = field(default_factory=trio.Lock)

    @property
    def stdin(self) -> trio.abc.SendStream:
        raise NotImplementedError

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        raise NotImplementedError

    # ----------------------------------------------------------------- writing

    async def send_line(self, raw: bytes) -> None:
        """Write one line exactly as given (a newline is added)."""
        await self.send_bytes(raw + b"\n")

    async def send_bytes(self, raw: bytes) -> None:
        async with self._send_lock:
            self.sent += raw
            await self.stdin.send_all(raw)

    async def send(self, message: Any) -> None:
        await self.send_line(json.dumps(message).encode())

    async def request(self, request_id: Any, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)

    async def close_stdin(self) -> None:
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.stdin.aclose()

    # ----------------------------------------------------------------- reading

    async def receive_line(self) -> bytes | None:
        """The next line from the bridge's stdout, or None at EOF."""
        while not self._lines:
            if self._eof:
                return None
            try:
                data = await self.stdout.receive_some(1 << 20)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            self.received += data
            items = self._splitter.feed(data) if data else self._splitter.close()
            self._lines.extend(item.data for item in items if isinstance(item, Line))
            self._eof = not data
        return self._lines.pop(0)

    async def receive(self) -> Any:
        line = await self.receive_line()
        assert line is not None, "the bridge closed its stdout"
        return json.loads(line)

    async def receive_until(self, predicate: Callable[[Any], bool]) -> list[Any]:
        """Messages up to and including the first one ``predicate`` accepts."""
        seen = []
        while True:
            message = await self.receive()
            seen.append(message)
            if predicate(message):
                return seen

    async def response_to(self, request_id: Any) -> Any:
        def matches(m: Any) -> bool:
            return isinstance(m, dict) and m.get("id") == request_id and "method" not in m

        return (await self.receive_until(matches))[-1]

    async def read_to_eof(self) -> list[bytes]:
        lines = []
        while (line := await self.receive_line()) is not None:
            lines.append(line)
        return lines

    async def wait(self) -> int:
        """The bridge's exit status, once it has exited."""
        raise NotImplementedError

    def file(self, name: str) -> Path:
        return self.dir / name


@dataclass
class RunningBridge(BridgeLines):
    """A bridge subprocess (``python -m acp_bridge``) in front of ``tests/fake_agent.py``."""

    process: trio.Process | preloaded.PreloadedProcess = field(kw_only=True)
    stderr_path: Path = field(kw_only=True)

    @property
    def stdin(self) -> trio.abc.SendStream:
        assert self.process.stdin is not None
        return self.process.stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        assert self.process.stdout is not None
        return self.process.stdout

    async def wait(self) -> int:
        return await self.process.wait()

    # ------------------------------------------------------------ the agent

    def pids(self) -> list[int]:
        """The agent's pid and its grandchild's, as far as they were written."""
        found = []
        for name in ("agent.pid", "grandchild.pid"):
            path = self.file(name)
            if path.exists() and path.read_text().strip():
                found.append(int(path.read_text()))
        return found

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def fake_agent_argv(directory: Path, *extra: str, grandchild: bool = False) -> list[str]:
    argv = [
        *FAKE_PYTHON,
        str(FAKE_AGENT),
        "--record",
        str(directory / "agent-received"),
        "--sent",
        str(directory / "agent-sent"),
        "--pidfile",
        str(directory / "agent.pid"),
        *extra,
    ]
    if grandchild:
        argv += ["--grandchild-pidfile", str(directory / "grandchild.pid")]
    return argv


OpenBridge = Callable[..., Any]
OpenMemoryBridge = Callable[..., AbstractAsyncContextManager["MemoryBridge"]]
# What keeps a bridge away from the user's own config and state (see bridge_env).
PRIVATE_ENV = ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME")


def bridge_folder(directory: Path, config: dict[str, Any] | None) -> tuple[Path, Path]:
    """A new folder for one bridge, with its config.yaml (the state in memory, ``config``
    on top); returns both."""
    directory.mkdir()
    config_path = directory / "config.yaml"
    config_path.write_text(yaml.safe_dump({"bridge": {"state": ":memory:", **(config or {})}}))
    return directory, config_path


@pytest.fixture
def bridge_env(tmp_path: Path) -> dict[str, str]:
    """An environment that keeps the bridge away from the user's config and state."""
    home = tmp_path / "home"
    home.mkdir()
    return {
        **os.environ,
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_STATE_HOME": str(home / "state"),
        "HOME": str(home),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
async def open_bridge(tmp_path: Path, bridge_env: dict[str, str]) -> AsyncIterator[OpenBridge]:
    """``async with open_bridge(*fake_agent_args, config={...}) as bridge:``.

    ``config`` is the ``bridge:`` section of a YAML config file (``config_file=False``: no
    file, ``--state :memory:`` instead); ``agent_argv`` replaces
    the fake agent; ``grandchild=True`` makes the fake agent leave a stubborn child.
    """
    started: list[RunningBridge] = []
    counter = 0

    @asynccontextmanager
    async def opener(
        *agent_args: str,
        config: dict[str, Any] | None = None,
        bridge_args: Sequence[str] = (),
        agent_argv: Sequence[str] | None = None,
        grandchild: bool = False,
        config_file: bool = True,
    ) -> AsyncIterator[RunningBridge]:
        nonlocal counter
        counter += 1
        directory, config_path = bridge_folder(tmp_path / f"bridge-{counter}", config)
        # Without a configuration file the bridge may answer initialize before it has
        # loaded (acp_bridge.runtime.early_initialize); a file of any content leaves it to
        # the runtime.
        config_args = ["--config", str(config_path)] if config_file else ["--state", ":memory:"]
        assert config_file or not config
        argv = (
            list(agent_argv)
            if agent_argv
            else fake_agent_argv(directory, *agent_args, grandchild=grandchild)
        )
        stderr_path = directory / "bridge-stderr"
        with stderr_path.open("wb") as stderr:
            process = await preloaded.start_bridge(
                [*config_args, *bridge_args, "--", *argv], env=bridge_env, stderr=stderr
            )
        bridge = RunningBridge(directory, process=process, stderr_path=stderr_path)
        started.append(bridge)
        try:
            yield bridge
        finally:
            with trio.CancelScope(shield=True):
                await _reap(bridge)

    yield opener
    for bridge in started:
        await _reap(bridge)


async def _reap(bridge: RunningBridge) -> None:
    """Leave nothing running, even when a test failed half-way."""
    with suppress(ProcessLookupError):
        if bridge.process.returncode is None:
            bridge.process.kill()
    await bridge.process.wait()
    for pid in bridge.pids():
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class MemoryBridge(BridgeLines):
    """The bridge's runtime in this process, configured from the same file the command line
    reads, over in-memory streams, in front of ``tests/fake_agent.py`` run as a coroutine
    (``memory_agent.ScriptedAgent``): no process. ``stderr()`` is what it logged, in the
    command line's format."""

    to_bridge: trio.abc.SendStream = field(kw_only=True)
    from_bridge: trio.abc.ReceiveStream = field(kw_only=True)
    spawner: ScriptedSpawner = field(kw_only=True)
    log: io.StringIO = field(kw_only=True)
    status: int | None = None
    finished: trio.Event = field(default_factory=trio.Event)

    @property
    def stdin(self) -> trio.abc.SendStream:
        return self.to_bridge

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self.from_bridge

    async def wait(self) -> int:
        await self.finished.wait()
        assert self.status is not None
        return self.status

    @property
    def agents(self) -> list[ScriptedAgent]:
        """Every agent the bridge started, in order."""
        return self.spawner.agents

    def stderr(self) -> str:
        return self.log.getvalue()


@pytest.fixture
async def open_memory_bridge(
    tmp_path: Path, bridge_env: dict[str, str]
) -> AsyncIterator[OpenMemoryBridge]:
    """``open_bridge`` without a process: ``async with open_memory_bridge(*fake_agent_args,
    config={...}) as bridge:``. ``bridge_args`` may hold ``--trace PATH``; what needs a
    process (a grandchild, another agent command, the early initialize) is refused."""
    counter = 0

    @asynccontextmanager
    async def opener(
        *agent_args: str, config: dict[str, Any] | None = None, bridge_args: Sequence[str] = ()
    ) -> AsyncIterator[MemoryBridge]:
        nonlocal counter
        counter += 1
        directory, config_path = bridge_folder(tmp_path / f"bridge-{counter}", config)
        trace: Path | None = None
        if bridge_args:
            assert bridge_args[0] == "--trace" and len(bridge_args) == 2, bridge_args
            trace = Path(bridge_args[1])
        argv = fake_agent_argv(directory, *agent_args)
        runtime = resolve_runtime(
            argv,
            agent_name=None,
            config_file=config_path,
            adapter=None,
            state=None,
            no_override=None,
            on_omitted=None,
            log_level=None,
            variables={key: bridge_env[key] for key in PRIVATE_ENV},
        )
        log = io.StringIO()
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("acp-bridge: %(levelname)s %(name)s: %(message)s"))
        logger = logging.getLogger("acp_bridge")
        level = logger.level
        logger.setLevel(runtime.config.bridge.log_level.upper())
        logger.addHandler(handler)
        to_bridge, bridge_in = trio.testing.memory_stream_one_way_pair()
        bridge_out, from_bridge = trio.testing.memory_stream_one_way_pair()
        tracer = make_tracer(runtime, trace, False)
        try:
            with SessionStore(runtime.state) as store:
                async with trio.open_nursery() as nursery:
                    spawner = ScriptedSpawner(nursery)
                    bridge = MemoryBridge(
                        directory,
                        to_bridge=to_bridge,
                        from_bridge=from_bridge,
                        spawner=spawner,
                        log=log,
                    )
                    relay = Bridge(
                        runtime.options,
                        bridge_in,
                        bridge_out,
                        Lifecycle.for_command(store, argv),
                        registry=runtime.registry,
                        tracer=tracer,
                        spawner=spawner,
                    )

                    async def run() -> None:
                        try:
                            bridge.status = await relay.run(watch_signals=False)
                        finally:
                            # As the process's streams close when it exits.
                            await bridge_out.aclose()
                            bridge.finished.set()

                    nursery.start_soon(run)
                    yield bridge
                    # As _reap kills a process left running: the test is over.
                    nursery.cancel_scope.cancel()
        finally:
            tracer.close()
            logger.removeHandler(handler)
            logger.setLevel(level)

    yield opener


@dataclass(frozen=True)
class VerifyReport:
    """What one ``acp-bridge verify`` run printed."""

    returncode: int
    table: str
    stderr: str

    def assert_passed(self) -> None:
        assert self.returncode == 0, self.table + self.stderr[-4000:]
        assert " 0 failed" in self.table and "FAIL" not in self.table, self.table


async def run_verify(*args: str, env: dict[str, str], timeout: float) -> VerifyReport:
    """Run ``python -m acp_bridge verify ARGS`` as a subprocess, as a user would."""
    with trio.fail_after(timeout):
        done = await trio.run_process(
            [sys.executable, "-m", "acp_bridge", "verify", *args],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return VerifyReport(done.returncode, done.stdout.decode(), done.stderr.decode())


async def verify_cached_preset(
    tmp_path: Path, preset: str, command: Sequence[str], timeout: float
) -> VerifyReport:
    """``verify --agent PRESET`` as an isolated user under ``tmp_path``, the preset started
    with ``command`` (the cached install) where the shipped one fetches it through npx."""
    config = write_verify_config(tmp_path / "config.yaml", preset, command)
    return await run_verify(
        "--config", str(config), "--agent", preset, env=isolated_env(tmp_path), timeout=timeout
    )
