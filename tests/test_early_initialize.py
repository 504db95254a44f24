"""The initialize exchange done before the bridge loads (acp_bridge.runtime.early_initialize).

Each case runs the bridge twice in front of the same agent with the same client: once
with the early exchange (no configuration file) and once without (an empty one, the usual
path). The client must see the same bytes and the same exit status both ways, and the
agent must receive the same bytes; the early exchange must have answered, or only begun,
the exchange before the runtime took over.

Most cases run in this process (:func:`run_in_memory`): the exchange on pipes in front
of an agent in a thread (tests/threaded_agent.py), then the runtime replaying it as the
command line does. What needs a process runs one: the command line's own early path
(its log line, the trace, a configuration file, a mistyped adapter, SIGTERM) and what a
fresh interpreter imports before the answer.
"""

# ruff: noqa: E501  (wire frames and agent scripts, one per line)

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import pkgutil
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_processes import live_processes
from conftest import FAKE_AGENT, PRIVATE_ENV, pid_alive
from memory_agent import FAKE_PYTHON
from threaded_agent import AgentFunction, Pipe, ThreadedAgent, scripted

from acp_bridge import builtin_adapters, registry
from acp_bridge.adapter import Adapter
from acp_bridge.commands.cli import Runtime, resolve_runtime
from acp_bridge.runtime import early_initialize
from acp_bridge.runtime.handover import Replay
from acp_bridge.runtime.relay import Bridge
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore

INITIALIZE = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'
SESSION_NEW = (
    b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}\n'
)
CLAUDE = "@agentclientprotocol/claude-agent-acp"
ANSWERED = "initialize before the bridge loaded: answered"
BEGUN = "initialize before the bridge loaded: forwarded"

# Agents for the edges: functions of the pipe they read and write (tests/threaded_agent.py).


def notifies_first(pipe: Pipe) -> int:
    request = json.loads(pipe.readline())
    hello = {"jsonrpc": "2.0", "method": "_agent/hello", "params": {}}
    ask = {"jsonrpc": "2.0", "id": "a-1", "method": "_agent/ask", "params": {}}
    pipe.write((json.dumps(hello) + "\n" + json.dumps(ask) + "\n").encode())
    answer = {"jsonrpc": "2.0", "id": request["id"], "result": {"protocolVersion": 1}}
    pipe.write((json.dumps(answer) + "\n").encode())
    for line in pipe:
        message = json.loads(line)
        if "method" in message and "id" in message:
            saw = {"jsonrpc": "2.0", "id": message["id"], "result": {"saw": message}}
            pipe.write((json.dumps(saw) + "\n").encode())
    return 0


def answers_then_notifies(pipe: Pipe, *, after: float = 0.0, first: float = 0.0) -> int:
    """Answers, then notifies (in the same write, or ``after`` seconds later); starts to
    read ``first`` seconds late."""
    time.sleep(first)
    request = json.loads(pipe.readline())
    answer = {"jsonrpc": "2.0", "id": request["id"], "result": {"protocolVersion": 1}}
    note = {"jsonrpc": "2.0", "method": "_agent/after", "params": {"n": 1} if not after else {}}
    if after:
        pipe.write((json.dumps(answer) + "\n").encode())
        time.sleep(after)
        pipe.write((json.dumps(note) + "\n").encode())
    else:
        pipe.write((json.dumps(answer) + "\n" + json.dumps(note) + "\n").encode())
    for _ in pipe:
        pass
    return 0


def exits_unanswered(pipe: Pipe) -> int:
    pipe.readline()
    return 3


def never_answers(pipe: Pipe) -> int:
    for _ in pipe:
        pass
    return 0


def answer_split(pipe: Pipe) -> int:
    request = json.loads(pipe.readline())
    text = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"protocolVersion": 1}})
    pipe.write(text[:20].encode())
    time.sleep(0.02)
    pipe.write((text[20:] + "\r\n").encode())
    for _ in pipe:
        pass
    return 0


# Agents of the tests that run processes: -c scripts (stdlib only).
NEVER_ANSWERS = """
import sys
for line in sys.stdin:
    pass
"""
ANSWERS_THEN_NOTIFIES_LATER = """
import json, sys, time
request = json.loads(sys.stdin.readline())
answer = {"jsonrpc": "2.0", "id": request["id"], "result": {"protocolVersion": 1}}
sys.stdout.write(json.dumps(answer) + "\\n")
sys.stdout.flush()
time.sleep(0.3)
sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "_agent/after", "params": {}}) + "\\n")
sys.stdout.flush()
for line in sys.stdin:
    pass
"""


@dataclass
class Run:
    stdout: bytes
    status: int
    stderr: str
    agent_received: bytes
    stage: str | None = None
    """How far the early exchange went (``answered``, ``forwarded``, ``read``); None:
    there was none (the usual path)."""


Agent = Callable[[Path], list[str]]
"""An agent command, given the file to record what it receives in."""


def run_bridge(
    directory: Path,
    env: dict[str, str],
    agent: Agent,
    steps: Sequence[Any],
    *,
    usual: bool,
    bridge_args: Sequence[str] = (),
    timeout: float = 30,
) -> Run:
    """Run the bridge's command line in front of ``agent``; ``steps`` as :class:`Client`'s."""
    directory.mkdir()
    config = ["--config", str(directory / "empty.yaml")] if usual else []
    (directory / "empty.yaml").write_text("bridge: {}\n")
    record = directory / "agent-received"
    argv = [
        sys.executable, "-m", "acp_bridge", "--state", ":memory:", "--log-level", "debug",
        *config, *bridge_args, "--", *agent(record),
    ]  # fmt: skip
    with (directory / "stderr").open("wb") as stderr:
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    assert process.stdin is not None and process.stdout is not None
    client = Client(process.stdin.fileno(), process.stdout.fileno(), steps, timeout)
    process.stdin.close()  # the client holds its own copies
    process.stdout.close()
    try:
        client.run()
        status = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return Run(
        client.received(),
        status,
        (directory / "stderr").read_text(errors="replace"),
        record.read_bytes() if record.exists() else b"",
    )


class Client:
    """The client's side of a bridge: ``steps`` are bytes to write, an int (wait for that
    many lines in all), ``"close"`` (close the bridge's stdin), or a float (sleep)."""

    def __init__(self, to_bridge: int, from_bridge: int, steps: Sequence[Any], timeout: float):
        self.to_bridge = os.fdopen(os.dup(to_bridge), "wb", buffering=0)
        self.from_bridge = os.fdopen(os.dup(from_bridge), "rb")
        self.steps = steps
        self.timeout = timeout
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.got: list[bytes] = []
        self.failure: BaseException | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with self.from_bridge:
            for line in self.from_bridge:
                self.lines.put(line)
        self.lines.put(b"")

    def run(self) -> None:
        """Take the steps, then close the bridge's stdin."""
        try:
            for step in self.steps:
                if isinstance(step, bytes):
                    self.to_bridge.write(step)
                elif isinstance(step, int):
                    while len(self.got) < step:
                        self.got.append(self.lines.get(timeout=self.timeout))
                elif step == "close":
                    self.to_bridge.close()
                else:
                    time.sleep(step)
        except BaseException as exc:
            self.failure = exc
        finally:
            self.to_bridge.close()

    def received(self) -> bytes:
        """Every line the bridge wrote, once it has closed its stdout."""
        if self.failure is not None:
            raise self.failure
        self._reader.join(self.timeout)
        while not self.lines.empty():
            self.got.append(self.lines.get())
        return b"".join(line for line in self.got if line)


def fake_agent(*args: str) -> Agent:
    return lambda record: [*FAKE_PYTHON, str(FAKE_AGENT), "--record", str(record), *args]


@contextlib.contextmanager
def loader(runtime_first: bool) -> Iterator[None]:
    """In this process the runtime is loaded already, and the exchange's loader would be
    done at once: it says so only for ``runtime_first``, else never (as when the agent
    answers before the imports end)."""
    load = early_initialize._Loader._load
    if not runtime_first:
        early_initialize._Loader._load = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        early_initialize._Loader._load = load  # type: ignore[method-assign]


def run_in_memory(
    directory: Path,
    env: dict[str, str],
    agent: AgentFunction,
    steps: Sequence[Any],
    *,
    usual: bool,
    bridge_args: Sequence[str] = (),
    runtime_first: bool = False,
    timeout: float = 30,
) -> Run:
    """What :func:`run_bridge` does, in this process: the early exchange (unless
    ``usual``) on pipes, in front of ``agent`` run in a thread, then the runtime replaying
    it (as ``cli.run_stdio_started_first`` does) with the same options from an empty
    configuration file. ``runtime_first``: the runtime is loaded before the agent starts."""
    directory.mkdir()
    config = directory / "empty.yaml"
    config.write_text("bridge: {}\n")
    adapter = (
        bridge_args[bridge_args.index("--adapter") + 1] if "--adapter" in bridge_args else None
    )
    no_override = "--no-override" in bridge_args
    exchanged = threading.Event()
    process = ThreadedAgent(agent, start_after=exchanged if runtime_first and not usual else None)
    client_in, to_bridge = os.pipe()
    from_bridge, client_out = os.pipe()
    client = Client(to_bridge, from_bridge, steps, timeout)
    os.close(to_bridge)
    os.close(from_bridge)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("acp-bridge: %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("acp_bridge")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    steps_taken = threading.Thread(target=client.run, daemon=True)
    try:
        process.start()
        steps_taken.start()
        exchange = None
        if not usual:
            with loader(runtime_first):
                exchange = early_initialize.exchange(
                    client_in, client_out, process.to_agent, process.from_agent,
                    adapter=adapter or early_initialize.AUTO, allow_override=not no_override,
                )  # fmt: skip
        exchanged.set()
        runtime = resolve_runtime(
            ["threaded-agent"], agent_name=None, config_file=config, adapter=adapter,
            state=":memory:", no_override=no_override or None, on_omitted=None,
            log_level="debug", variables={key: env[key] for key in PRIVATE_ENV},
        )  # fmt: skip
        status = trio.run(relay, runtime, process, client_in, client_out, exchange)
        steps_taken.join(timeout)
        stdout = client.received()
        process.join(timeout)
    finally:
        exchanged.set()
        process.close()
        logger.removeHandler(handler)
        logger.setLevel(level)
    return Run(
        stdout,
        status,
        log.getvalue(),
        bytes(process.received),
        exchange.stage if exchange is not None else None,
    )


async def relay(
    runtime: Runtime,
    process: ThreadedAgent,
    client_fd: int,
    client_out_fd: int,
    exchange: early_initialize.Exchange | None,
) -> int:
    """The runtime on the bridge's ends of the pipes, replaying ``exchange``."""
    process.take_over()
    client_in: trio.abc.ReceiveStream = trio.lowlevel.FdStream(client_fd)
    client_out: trio.abc.SendStream = trio.lowlevel.FdStream(client_out_fd)
    streams = [client_in, client_out, process.stdin, process.stdout]
    if exchange is not None:
        replay = Replay(exchange)
        replay.agent(process)  # type: ignore[arg-type]
        client_in, client_out = replay.client(client_in, client_out)

    async def no_other_agent(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a second agent was asked for: {args}")

    try:
        with SessionStore(runtime.state) as store:
            bridge = Bridge(
                runtime.options, client_in, client_out,
                Lifecycle.for_command(store, runtime.options.agent_argv),
                registry=runtime.registry, spawner=no_other_agent,
            )  # fmt: skip
            bridge.adopt(process)
            with trio.fail_after(30):
                return await bridge.run(watch_signals=False)
    finally:
        for stream in streams:
            await stream.aclose()


def both_ways(
    tmp_path: Path,
    bridge_env: dict[str, str],
    agent: AgentFunction,
    steps: Sequence[Any],
    bridge_args: Sequence[str] = (),
    *,
    same_output: bool = True,
    runtime_first: bool = False,
) -> tuple[Run, Run]:
    early = run_in_memory(tmp_path / "early", bridge_env, agent, steps, usual=False,
                          bridge_args=bridge_args, runtime_first=runtime_first)  # fmt: skip
    usual = run_in_memory(tmp_path / "usual", bridge_env, agent, steps, usual=True,
                          bridge_args=bridge_args)  # fmt: skip
    assert usual.stage is None
    assert "differs" not in early.stderr, early.stderr
    if same_output:
        assert early.stdout == usual.stdout
    assert early.status == usual.status
    assert early.agent_received == usual.agent_received
    return early, usual


@pytest.mark.parametrize(
    ("agent_args", "bridge_args", "adapter"),
    [
        (["--name", CLAUDE], [], "claude"),
        (["--caps", '{"sessionCapabilities":{"systemPrompt":{"mode":{"override":{}}}}}'], [], "native"),
        (["--name", "plain"], [], "first-turn"),
        (["--name", CLAUDE], ["--no-override"], "claude"),
        (["--name", "goose"], [], "goose"),
        (["--name", "codex-acp"], [], "codex"),
        (["--name", CLAUDE], ["--adapter", "passthrough"], None),
        (["--name", "plain"], ["--adapter", "first-turn"], "first-turn"),
        (["--fail-method", "initialize"], [], None),
    ],
)  # fmt: skip
def test_the_early_answer_is_the_usual_one(
    tmp_path: Path,
    bridge_env: dict[str, str],
    agent_args: list[str],
    bridge_args: list[str],
    adapter: str | None,
) -> None:
    early, _ = both_ways(
        tmp_path, bridge_env, scripted(*agent_args), [INITIALIZE, 1, SESSION_NEW, 2, "close"],
        bridge_args,
    )  # fmt: skip
    assert early.stage == "answered"
    answer = json.loads(early.stdout.splitlines()[0])
    caps = answer.get("result", {}).get("agentCapabilities", {})
    assert caps.get("_meta", {}).get("acp-bridge", {}).get("adapter") == adapter
    assert early.status == 0


@pytest.mark.parametrize("name", [CLAUDE, "goose", "plain"])
def test_a_version_2_initialize(tmp_path: Path, bridge_env: dict[str, str], name: str) -> None:
    initialize = (
        b'{"jsonrpc":"2.0","id":"i","method":"initialize","params":{"protocolVersion":2}}\n'
    )
    early, _ = both_ways(
        tmp_path, bridge_env, scripted("--name", name, "--caps", '{"session":{}}'),
        [initialize, 1, "close"],
    )  # fmt: skip
    assert early.stage == "answered"
    assert "systemPrompt" in json.loads(early.stdout)["result"]["capabilities"]["session"]


def test_the_agents_own_bytes_pass_unchanged(tmp_path: Path, bridge_env: dict[str, str]) -> None:
    early, _ = both_ways(
        tmp_path, bridge_env, answer_split, [INITIALIZE, 1, "close"],
        ["--adapter", "passthrough"],
    )  # fmt: skip
    assert early.stage == "answered"
    # The agent wrote its answer in two pieces and ended it with \r\n; the client gets
    # the frame (the bridge writes \n-terminated lines).
    assert early.stdout == b'{"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}}\n'


def test_an_agent_that_starts_slowly_is_answered_by_the_runtime(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    """Once the runtime has loaded it waits for the answer itself, ready for the next
    request (claude-agent-acp takes about a second to answer). The agent starts once the
    runtime has loaded: the test is about what happens after it has."""
    early, _ = both_ways(
        tmp_path, bridge_env, scripted("--name", CLAUDE),
        [INITIALIZE, 1, SESSION_NEW, 2, "close"], runtime_first=True,
    )  # fmt: skip
    assert early.stage == "forwarded"


def test_what_the_client_pipelines_is_left_to_the_runtime(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    garbage = b"not json\n"
    early, _ = both_ways(
        tmp_path, bridge_env, scripted("--name", CLAUDE),
        [INITIALIZE + garbage + SESSION_NEW, 3, "close"],
    )  # fmt: skip
    assert early.stage == "forwarded"
    # The invalid line is answered first, as always: it waits for nothing.
    assert json.loads(early.stdout.splitlines()[0])["error"]["code"] == -32700


def test_what_the_client_sends_while_the_agent_starts_is_left_to_the_runtime(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    slow = partial(answers_then_notifies, first=1.0)
    early, _ = both_ways(
        tmp_path, bridge_env, slow, [INITIALIZE, 0.5, SESSION_NEW, 2, "close"],
        ["--adapter", "passthrough"],
    )  # fmt: skip
    assert early.stage == "forwarded"


def test_what_the_agent_writes_before_its_answer_is_left_to_the_runtime(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    early, _ = both_ways(
        tmp_path, bridge_env, notifies_first, [INITIALIZE, 3, SESSION_NEW, 4, "close"]
    )
    assert early.stage == "forwarded"
    lines = [json.loads(line) for line in early.stdout.splitlines()]
    assert [line.get("method") for line in lines[:2]] == ["_agent/hello", "_agent/ask"]


def test_what_the_agent_writes_with_its_answer_is_left_to_the_runtime(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    early, _ = both_ways(tmp_path, bridge_env, answers_then_notifies, [INITIALIZE, 2, "close"])
    assert early.stage == "forwarded"


def test_what_the_agent_writes_after_its_answer_follows_it(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    later = partial(answers_then_notifies, after=0.3)
    early, _ = both_ways(tmp_path, bridge_env, later, [INITIALIZE, 2, "close"])
    assert early.stage == "answered"
    lines = [json.loads(line) for line in early.stdout.splitlines()]
    assert lines[0]["id"] == 0 and lines[1]["method"] == "_agent/after"


def test_a_client_that_leaves_after_initialize(tmp_path: Path, bridge_env: dict[str, str]) -> None:
    slow = partial(answers_then_notifies, first=0.5)
    early, _ = both_ways(tmp_path, bridge_env, slow, [INITIALIZE, "close"])
    assert early.stage == "forwarded"
    assert any(json.loads(line).get("id") == 0 for line in early.stdout.splitlines())


def test_an_agent_that_exits_without_answering(tmp_path: Path, bridge_env: dict[str, str]) -> None:
    early, _ = both_ways(tmp_path, bridge_env, exits_unanswered, [INITIALIZE, 1])
    assert early.stage == "forwarded"
    assert json.loads(early.stdout)["error"]["data"]["exitStatus"] == 3
    assert early.status == 3


def test_an_agent_that_never_answers(tmp_path: Path, bridge_env: dict[str, str]) -> None:
    early, usual = both_ways(
        tmp_path, bridge_env, never_answers, [INITIALIZE, 1.0, "close"],
        same_output=False,
    )  # fmt: skip
    assert early.stage == "forwarded"
    # The client left; the agent exits on EOF; the client still gets the error for its
    # initialize (the runtime once cancelled that write at the end, at times).
    exited = (
        b'{"jsonrpc":"2.0","id":0,"error":{"code":-32603,"message":"The agent exited with '
        b'status 0.","data":{"exitStatus":0}}}\n'
    )
    assert (early.stdout, usual.stdout) == (exited, exited)


@pytest.mark.parametrize(
    "first",
    [
        b"not json\n",
        b"\n",
        SESSION_NEW,
        b'{"jsonrpc":"2.0","method":"initialize","params":{}}\n',
        b'{"jsonrpc":"2.0","id":5,"result":{}}\n',
        b'{"jsonrpc":"2.0","id":null,"method":"initialize","params":{"protocolVersion":1}}\n',
    ],
    ids=["invalid", "blank", "session-new", "notification", "response", "null-id"],
)
def test_a_first_line_that_is_not_an_initialize_request(
    tmp_path: Path, bridge_env: dict[str, str], first: bytes
) -> None:
    early, _ = both_ways(
        tmp_path, bridge_env, scripted("--name", CLAUDE), [first, 0.3, INITIALIZE, 0.5, "close"]
    )
    assert early.stage == "read"


def test_a_client_that_sends_nothing(tmp_path: Path, bridge_env: dict[str, str]) -> None:
    both_ways(tmp_path, bridge_env, scripted("--name", CLAUDE), ["close"])


def test_the_trace_records_the_early_initialize(tmp_path: Path, bridge_env: dict[str, str]) -> None:
    trace = tmp_path / "trace.jsonl"
    early = run_bridge(
        tmp_path / "early", bridge_env, fake_agent("--name", CLAUDE),
        [INITIALIZE, 1, "close"], usual=False, bridge_args=["--trace", str(trace)],
    )  # fmt: skip
    assert ANSWERED in early.stderr
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    directions = [record["dir"] for record in records]
    assert directions[:3] == ["client->bridge", "bridge->agent", "agent->bridge"]
    assert "agent->client" in directions


def test_a_mistyped_adapter_is_refused_before_the_agent_starts(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    pidfile = tmp_path / "agent.pid"
    done = subprocess.run(
        [
            sys.executable, "-m", "acp_bridge", "--state", ":memory:", "--adapter", "claud",
            "--", *FAKE_PYTHON, str(FAKE_AGENT), "--pidfile", str(pidfile),
        ],
        input=INITIALIZE, capture_output=True, env=bridge_env, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert b"unknown adapter 'claud'" in done.stderr
    assert done.stdout == b""
    time.sleep(0.3)
    assert not pidfile.exists()


def test_sigterm_while_waiting_for_the_agent_leaves_nothing_behind(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    pidfile = tmp_path / "agent.pid"
    script = (
        f"import os, sys\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n" + NEVER_ANSWERS
    )
    # Marks every process of the run (the agent, its watchdog) by their environment.
    marker = ("ACP_BRIDGE_TEST_RUN", os.urandom(8).hex())
    process = subprocess.Popen(
        [sys.executable, "-m", "acp_bridge", "--state", ":memory:", "--",
         sys.executable, "-c", script],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**bridge_env, marker[0]: marker[1]},
    )  # fmt: skip
    try:
        assert process.stdin is not None
        process.stdin.write(INITIALIZE)
        process.stdin.flush()
        deadline = time.monotonic() + 10
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the bridge now waits for the answer
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 128 + signal.SIGTERM
        # Right at the bridge's end, nothing it started is left: the agent, nor its watchdog.
        assert live_processes("=".join(marker)) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid)


def test_a_configuration_file_leaves_initialize_to_the_runtime(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    config = Path(bridge_env["XDG_CONFIG_HOME"]) / "acp-bridge" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("bridge: {allow_override: false}\n")
    run = run_bridge(
        tmp_path / "run", bridge_env, fake_agent("--name", CLAUDE), [INITIALIZE, 1, "close"],
        usual=False,
    )  # fmt: skip
    assert ANSWERED not in run.stderr and BEGUN not in run.stderr
    caps = json.loads(run.stdout.splitlines()[0])["result"]["agentCapabilities"]
    assert caps["sessionCapabilities"]["systemPrompt"] == {}


def test_every_builtin_adapter_lives_in_the_module_named_after_it() -> None:
    package = importlib.import_module(builtin_adapters.PACKAGE)
    found: dict[str, type[Adapter]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{builtin_adapters.PACKAGE}.{info.name}")
        for adapter in vars(module).values():
            if (
                isinstance(adapter, type)
                and issubclass(adapter, Adapter)
                and adapter.name
                and adapter.__module__ == module.__name__
            ):
                found[adapter.name] = adapter
    assert sorted(found) == builtin_adapters.names()
    for name, adapter in found.items():
        assert builtin_adapters.module_of(name) == adapter.__module__
        assert registry.builtin(name) is adapter
    assert builtin_adapters.module_of("claud") is None
    with pytest.raises(registry.AdapterNotFound):
        registry.builtin("claud")


def test_the_early_exchange_assumes_what_the_shipped_defaults_say() -> None:
    from acp_bridge.settings import load_config

    bridge = load_config(None, environ={"HOME": "/nonexistent"}).bridge
    assert bridge.adapter == early_initialize.AUTO
    assert bridge.adapter_paths == [] and bridge.adapter_options == {}
    assert bridge.allow_override is True and bridge.trace is None
    assert bridge.line_limit >= early_initialize.LINE_LIMIT


@pytest.mark.parametrize("adapter", ["passthrough", "claude", "goose", "native", "first-turn"])
def test_the_exchange_loads_no_heavy_module_before_the_answer(adapter: str) -> None:
    """With a named adapter, nothing of trio, pydantic, click or yaml is imported in the
    main thread before the answer is written (the loader thread imports them meanwhile)."""
    probe = (
        "import os, sys, subprocess\n"
        "from acp_bridge.runtime import early_initialize\n"
        "heavy = ('trio', 'pydantic', 'click', 'yaml')\n"
        "before = [m for m in heavy if m in sys.modules]\n"
        "agent = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdin=subprocess.PIPE,"
        " stdout=subprocess.PIPE)\n"
        "client_in, client_writes = os.pipe()\n"
        "os.write(client_writes, sys.argv[2].encode())\n"
        "client_reads, client_out = os.pipe()\n"
        "early_initialize._Loader._load = staticmethod(lambda: None)\n"
        "done = early_initialize.exchange(client_in, client_out, agent.stdin.fileno(),"
        " agent.stdout.fileno(), adapter=sys.argv[3])\n"
        "print(before, [m for m in heavy if m in sys.modules], done.answered)\n"
        "agent.kill()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, ANSWERS_THEN_NOTIFIES_LATER, INITIALIZE.decode(), adapter],
        capture_output=True, timeout=30, check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )  # fmt: skip
    assert done.stdout.decode().split() == ["[]", "[]", "True"]


ANSWERS_AS = """
import json, sys
request = json.loads(sys.stdin.readline())
answer = {"jsonrpc": "2.0", "id": request["id"], "result": RESULT}
sys.stdout.write(json.dumps(answer) + "\\n")
sys.stdout.flush()
for line in sys.stdin:
    pass
"""


@pytest.mark.parametrize(
    ("name", "advertises", "chosen"),
    [
        ("@agentclientprotocol/claude-agent-acp", True, "claude"),
        ("goose", False, "goose"),
        ("some-agent", True, "native"),
        ("some-agent", False, "first_turn"),
        (None, False, "first_turn"),
    ],
)
def test_the_automatic_choice_imports_only_the_chosen_adapter_before_the_answer(
    name: str | None, advertises: bool, chosen: str
) -> None:
    """The adapter is chosen from the agent's answer by the table of agent names: no other
    adapter, and nothing of trio, pydantic, click or yaml, is imported in the main thread
    before the client has its answer."""
    result: dict[str, Any] = {"protocolVersion": 1, "agentCapabilities": {}}
    if name is not None:
        result["agentInfo"] = {"name": name, "version": "1.0.0"}
    if advertises:
        result["agentCapabilities"]["sessionCapabilities"] = {"systemPrompt": {}}
    agent = ANSWERS_AS.replace("RESULT", repr(result))
    probe = (
        "import os, sys, subprocess\n"
        "from acp_bridge.runtime import early_initialize\n"
        "heavy = ('trio', 'pydantic', 'click', 'yaml')\n"
        "agent = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdin=subprocess.PIPE,"
        " stdout=subprocess.PIPE)\n"
        "client_in, client_writes = os.pipe()\n"
        "os.write(client_writes, sys.argv[2].encode())\n"
        "client_reads, client_out = os.pipe()\n"
        "early_initialize._Loader._load = staticmethod(lambda: None)\n"
        "done = early_initialize.exchange(client_in, client_out, agent.stdin.fileno(),"
        " agent.stdout.fileno())\n"
        "adapters = [m for m in sys.modules if m.startswith('acp_bridge.adapters.')]\n"
        "print([m for m in heavy if m in sys.modules], adapters, done.answered)\n"
        "agent.kill()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, agent, INITIALIZE.decode()],
        capture_output=True, timeout=30, check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )  # fmt: skip
    expected = f"[] ['acp_bridge.adapters.{chosen}'] True"
    assert done.stdout.decode().strip() == expected


def test_the_early_answer_lends_the_adapter_the_runtimes_one_context() -> None:
    from acp_bridge.adapter import AdapterContext
    from acp_bridge.runtime.adapter_context import LentContext

    interface = {name for name in vars(AdapterContext) if not name.startswith("_")}
    interface |= set(AdapterContext.__annotations__)
    context = early_initialize.early_context()
    assert type(context) is LentContext
    assert {name for name in dir(context) if not name.startswith("_")} == interface
    assert context.live_sessions() == set() and context.adapter_options("claude") == {}
    assert context.agent_environment() == dict(os.environ)
    # No process is running yet: an adapter that asks for one leaves the answer to the runtime.
    with pytest.raises(early_initialize._NotYet):
        context.primary  # noqa: B018

    async def background() -> None:
        pass

    with pytest.raises(early_initialize._NotYet):
        context.start_soon(background)
