"""A client, a bridge and the fake agent wired together for the systemPrompt tests.

The bridge runs either in this process, over in-memory streams in front of the fake agent
run as a coroutine (``memory_agent.ScriptedAgent``: no process), or as its own
``python -m acp_bridge`` process in front of ``tests/fake_agent.py``. Either way the test
talks through :class:`Peer`, which checks every response it gets against the official
schema, and reads what the agent really received from the fake agent's ``--record`` file.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

import trio
import trio.testing
from memory_agent import FAKE_PYTHON, ScriptedSpawner
from preloaded import bridge_client
from schema import validate_agent_frame, validate_initialize_response

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.registry import AdapterRegistry
from acp_bridge.runtime.client import AcpClient, connect
from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore
from acp_bridge.wire.jsonrpc import JsonObject

FAKE_AGENT: Final = Path(__file__).with_name("fake_agent.py")
AGENT_NAME: Final = "fake-agent"
# Generous: every step is a local pipe round trip, but CI machines can be slow.
TIMEOUT: Final = 30
CWD: Final = "/"

NATIVE_APPEND: Final[JsonObject] = {"sessionCapabilities": {"systemPrompt": {}}}
NATIVE_OVERRIDE: Final[JsonObject] = {
    "sessionCapabilities": {"systemPrompt": {"mode": {"override": {}}}}
}


def wire_prompt(*texts: str, mode: str = "append") -> JsonObject:
    return {"mode": mode, "content": [{"type": "text", "text": text} for text in texts]}


def joined(*texts: str) -> str:
    """What a prompt of these blocks delivers: the blocks joined by a blank line."""
    return "\n\n".join(texts)


def fingerprint(*texts: str, mode: str = "append") -> str:
    return SystemPrompt.of_text("append" if mode == "append" else "override", *texts).fingerprint()


@dataclass
class FakeAgent:
    """How to start ``tests/fake_agent.py``, and what it received."""

    record: Path
    caps: JsonObject = field(default_factory=dict)
    name: str = AGENT_NAME
    fail_methods: Sequence[str] = ()
    session_prefix: str = ""

    def argv(self) -> list[str]:
        argv = [*FAKE_PYTHON, str(FAKE_AGENT), "--record", str(self.record)]
        argv += ["--name", self.name, "--caps", json.dumps(self.caps)]
        for method in self.fail_methods:
            argv += ["--fail-method", method]
        if self.session_prefix:
            argv += ["--session-prefix", self.session_prefix]
        return argv

    def received(self) -> list[JsonObject]:
        """Every message the agent read, in order (across restarts of the agent)."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_bytes().splitlines() if line]

    def methods(self) -> list[str]:
        return [m["method"] for m in self.received() if "method" in m]

    def params_of(self, method: str) -> list[JsonObject]:
        return [m.get("params") or {} for m in self.received() if m.get("method") == method]

    def prompts(self, session_id: str) -> list[list[JsonObject]]:
        """The ``prompt`` blocks of each ``session/prompt`` the agent got for a session."""
        return [
            p["prompt"] for p in self.params_of("session/prompt") if p["sessionId"] == session_id
        ]


class Tee(trio.abc.ReceiveStream):
    """A receive stream that keeps a copy of every byte read through it."""

    def __init__(self, inner: trio.abc.ReceiveStream) -> None:
        self.inner = inner
        self.data = bytearray()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self.data += data
        return bytes(data)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def lines(self) -> list[bytes]:
        return bytes(self.data).splitlines()


@dataclass
class Peer:
    """The client side of a bridge under test; every response is schema-checked."""

    client: AcpClient
    version: int = 1
    tee: Tee | None = None
    responses: list[JsonObject] = field(default_factory=list)

    async def initialize(self) -> JsonObject:
        """The ``initialize`` result the client got (already validated)."""
        frame = await self.client.request_raw(
            "initialize", {"protocolVersion": self.version, "clientCapabilities": {}}
        )
        validate_initialize_response(frame, version=self.version)
        self.responses.append(frame)
        result: JsonObject = frame["result"]
        return result

    async def call(self, method: str, params: JsonObject) -> JsonObject:
        """The whole response frame (already validated)."""
        frame = await self.client.request_raw(method, params)
        validate_agent_frame(frame, version=self.version)
        self.responses.append(frame)
        return frame

    async def ok(self, method: str, params: JsonObject) -> Any:
        frame = await self.call(method, params)
        assert "error" not in frame, frame
        return frame["result"]

    async def error(self, method: str, params: JsonObject) -> JsonObject:
        frame = await self.call(method, params)
        assert "error" in frame, frame
        error: JsonObject = frame["error"]
        return error

    async def new(self, prompt: JsonObject | None = None, **extra: Any) -> str:
        params: JsonObject = {"cwd": CWD, "mcpServers": [], **extra}
        if prompt is not None:
            params["systemPrompt"] = prompt
        result = await self.ok("session/new", params)
        session_id: str = result["sessionId"]
        return session_id

    async def load(self, session_id: str, prompt: JsonObject | None = None) -> None:
        await self.ok("session/load", lifecycle_params("session/load", session_id, prompt))

    async def resume(self, session_id: str, prompt: JsonObject | None = None) -> None:
        await self.ok("session/resume", lifecycle_params("session/resume", session_id, prompt))

    async def fork(self, session_id: str, prompt: JsonObject | None = None) -> str:
        params = lifecycle_params("session/fork", session_id, prompt)
        result = await self.ok("session/fork", params)
        fork_id: str = result["sessionId"]
        return fork_id

    async def prompt(self, session_id: str, text: str = "hello") -> None:
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        await self.ok("session/prompt", params)

    async def sync(self) -> None:
        """Return once the agent has read everything the bridge forwarded before."""
        await self.client.request("_test/echo", {"sync": True})


def lifecycle_params(method: str, session_id: str | None, prompt: object = None) -> JsonObject:
    params: JsonObject = {"cwd": CWD}
    if method in ("session/new", "session/load"):
        params["mcpServers"] = []
    if session_id is not None and method != "session/new":
        params["sessionId"] = session_id
    if prompt is not None:
        params["systemPrompt"] = prompt
    return params


@asynccontextmanager
async def bridge_in_process(
    agent: FakeAgent,
    store: SessionStore,
    *,
    version: int = 1,
    registry: AdapterRegistry | None = None,
    bridge_options: BridgeOptions | None = None,
    **options: Any,
) -> AsyncIterator[Peer]:
    """A bridge over in-memory streams in front of the fake agent as a coroutine;
    ``bridge_options`` (the agent's command among them) replace ``options``."""
    to_bridge_send, to_bridge_receive = trio.testing.memory_stream_one_way_pair()
    to_client_send, to_client_receive = trio.testing.memory_stream_one_way_pair()
    tee = Tee(to_client_receive)
    if bridge_options is None:
        bridge_options = BridgeOptions(agent_argv=agent.argv(), shutdown_grace=5.0, **options)
    async with trio.open_nursery() as nursery:
        bridge = Bridge(
            bridge_options,
            to_bridge_receive,
            to_client_send,
            Lifecycle(store, AGENT_NAME),
            registry=registry,
            spawner=ScriptedSpawner(nursery),
        )
        nursery.start_soon(partial(bridge.run, watch_signals=False))
        async with connect(to_bridge_send, tee) as client:
            yield Peer(client, version, tee)
        await to_bridge_send.aclose()


@asynccontextmanager
async def in_process_peer(agent: FakeAgent, **options: Any) -> AsyncIterator[Peer]:
    """An initialized peer of ``bridge_in_process`` whose session store lives in memory only."""
    with SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, **options) as peer:
            await peer.initialize()
            yield peer


def bridge_env(home: Path) -> dict[str, str]:
    """An environment where no user config or state of the machine running the tests leaks in."""
    return {
        **os.environ,
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_STATE_HOME": str(home / "state"),
    }


@asynccontextmanager
async def bridge_process(
    agent: FakeAgent, *options: str, home: Path, version: int = 1
) -> AsyncIterator[Peer]:
    """``python -m acp_bridge OPTIONS -- fake_agent ...`` as a process (forked from one that
    has imported the bridge: ``preloaded``)."""
    args = [*options, "--", *agent.argv()]
    async with bridge_client(args, bridge_env(home)) as (client, _process):
        yield Peer(client, version)


@asynccontextmanager
async def command_in_process(
    agent: FakeAgent,
    *,
    home: Path,
    config: Path | None = None,
    adapter: str | None = None,
    no_override: bool = False,
    version: int = 1,
) -> AsyncIterator[Peer]:
    """The bridge as ``acp-bridge [--config CONFIG] [--adapter ADAPTER] [--no-override]
    --state :memory: -- fake_agent ...`` configures it (the run command's own
    ``resolve_runtime``: the configuration file, the user's adapter folders, the options),
    run in this process in front of the fake agent as a coroutine. Without ``config``, an empty file
    stands for none (what this machine's user may have set must not leak in)."""
    from acp_bridge.commands.cli import resolve_runtime

    environment = bridge_env(home)
    if config is None:
        config = home / "empty-config.yaml"
        config.write_text("bridge: {}\n")
    runtime = resolve_runtime(
        agent.argv(),
        agent_name=None,
        config_file=config,
        adapter=adapter,
        state=":memory:",
        no_override=no_override or None,
        on_omitted=None,
        log_level=None,
        variables={key: environment[key] for key in ("HOME", "XDG_CONFIG_HOME")},
    )
    with SessionStore(runtime.state) as store:
        async with bridge_in_process(
            agent, store, version=version, registry=runtime.registry, bridge_options=runtime.options
        ) as peer:
            yield peer


@dataclass
class Restart:
    """Two bridge runs, one after the other, keeping sessions in one state file.

    Each run is a bridge of its own (``bridge_in_process``) with its own connection to the
    file, closed when the run ends, as a bridge process's is when it exits. ``first`` is the
    fake agent before the restart and ``second`` the one after it, so a test can tell what
    each bridge sent. Each peer comes already initialized.
    """

    home: Path
    caps: JsonObject = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = str(self.home / "state.db")
        self.first = FakeAgent(self.home / "first.jsonl", caps=self.caps)
        self.second = FakeAgent(self.home / "second.jsonl", caps=self.caps)

    def before(self) -> AbstractAsyncContextManager[Peer]:
        return self._bridge(self.first)

    def after(self) -> AbstractAsyncContextManager[Peer]:
        return self._bridge(self.second)

    @asynccontextmanager
    async def _bridge(self, agent: FakeAgent) -> AsyncIterator[Peer]:
        with SessionStore(self.state) as store:
            async with bridge_in_process(agent, store) as peer:
                await peer.initialize()
                yield peer
