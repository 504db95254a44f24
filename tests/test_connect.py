"""``acp-bridge connect``: an editor's stdio end for a ``serve`` sidecar.

The sidecar runs in this process in front of the fake agent (a coroutine); ``connect``
runs as the subprocess an editor would launch, with the token in its environment, where
the command itself is the subject (the token from the environment or a file, a sidecar
killed), and as its relay in this process (``open_memory_connect``) where what it relays
is.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import trio
from click.testing import CliRunner
from conftest import fake_agent_argv
from harness import bridge_env
from memory_agent import ScriptedSpawner
from preloaded import start_bridge
from sidecar import (
    INITIALIZE,
    open_connect,
    open_memory_connect,
    system_prompt,
    wait_listening,
)

from acp_bridge.commands.cli import main
from acp_bridge.commands.connect import Outstanding, with_token
from acp_bridge.commands.serve import ListenAddress, ServeLimits, Server, serve
from acp_bridge.registry import AdapterRegistry
from acp_bridge.runtime.relay import BridgeOptions
from acp_bridge.state.store import SessionStore

NATIVE = json.dumps({"sessionCapabilities": {"systemPrompt": {}}})
TOKEN = "c0nnect-t0ken"


@asynccontextmanager
async def sidecar(
    tmp_path: Path,
    token: str | None = TOKEN,
    limits: ServeLimits | None = None,
    spawner: ScriptedSpawner | None = None,
) -> AsyncIterator[str]:
    """A TCP ``serve`` on 127.0.0.1 in front of the fake agent, run as a coroutine by
    ``spawner``; yields its address."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir(exist_ok=True)
    options = BridgeOptions(
        agent_argv=fake_agent_argv(agent_dir, "--caps", NATIVE), shutdown_grace=0.5
    )
    server = Server(
        options,
        SessionStore(":memory:"),
        AdapterRegistry(),
        token,
        limits,
        spawner=spawner or ScriptedSpawner(),
    )
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve, server, ListenAddress("tcp", host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"tcp://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def stoppable_sidecar(
    tmp_path: Path, spawner: ScriptedSpawner | None = None
) -> AsyncIterator[tuple[str, trio.Event]]:
    """:func:`sidecar` in a task of its own; setting the event shuts it down (its agent
    stops, its socket closes) while the body goes on. Yields the address and the event."""
    stop = trio.Event()

    async def run_sidecar(task_status: trio.TaskStatus[str]) -> None:
        async with sidecar(tmp_path, spawner=spawner) as address:
            task_status.started(address)
            await stop.wait()

    async with trio.open_nursery() as nursery:
        yield await nursery.start(run_sidecar), stop
        stop.set()


def agent_lines(tmp_path: Path, name: str = "agent-received") -> list[bytes]:
    path = tmp_path / "agent" / name
    return path.read_bytes().splitlines() if path.exists() else []


async def test_a_session_through_connect_reaches_the_agent_without_the_token(
    tmp_path: Path,
) -> None:
    editor_dir = tmp_path / "editor"
    with trio.fail_after(30):
        async with (
            sidecar(tmp_path) as address,
            open_connect(address, editor_dir, token=TOKEN) as editor,
        ):
            await editor.request(0, "initialize", INITIALIZE)
            result = (await editor.response_to(0))["result"]
            assert result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}
            prompt = system_prompt("PIRATE")
            params = {"cwd": "/", "mcpServers": [], "systemPrompt": prompt}
            await editor.request(1, "session/new", params)
            assert (await editor.response_to(1))["result"] == {"sessionId": "sess-1"}
            # Frames after initialize travel unchanged, spacing and key order included.
            odd = b'{"id": 2,  "method":"_test/echo", "jsonrpc":"2.0","params":{"b":1,"a":[ ]}}'
            await editor.send_line(odd)
            await editor.response_to(2)
            await editor.close_stdin()
            assert await editor.wait() == 0
    received = agent_lines(tmp_path)
    assert odd in received
    assert any(b"session/new" in line and b"PIRATE" in line for line in received)
    assert not any(TOKEN.encode() in line for line in received)
    # What the agent sent after initialize reached the editor byte for byte.
    sent = agent_lines(tmp_path, "agent-sent")
    editor_lines = bytes(editor.received).splitlines()
    assert sent[1:] == editor_lines[1:]
    assert TOKEN not in (tmp_path / "editor" / "connect-stderr").read_text()


async def test_the_token_can_come_from_a_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with trio.fail_after(30):
        async with sidecar(tmp_path) as address:
            args = ["--token-file", str(token_file)]
            async with open_connect(address, tmp_path / "editor", args=args) as editor:
                await editor.request(0, "initialize", INITIALIZE)
                assert "result" in await editor.response_to(0)
                await editor.close_stdin()
                assert await editor.wait() == 0


async def test_a_wrong_or_missing_token_is_an_error_to_initialize(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with sidecar(tmp_path) as address:
            for name, token in (("wrong", "not-the-token"), ("missing", None)):
                async with open_memory_connect(address, tmp_path / name, token=token) as editor:
                    await editor.request("init-7", "initialize", INITIALIZE)
                    answer = await editor.response_to("init-7")
                    assert answer["error"]["code"] == -32000
                    assert "token" in answer["error"]["message"]
                    # The sidecar closed the connection; connect leaves too.
                    assert await editor.read_to_eof() == []
                    assert await editor.wait() == 1
    assert agent_lines(tmp_path) == []  # no agent was started


async def test_an_unreachable_sidecar_is_an_error_to_initialize(tmp_path: Path) -> None:
    with trio.fail_after(30):
        address = f"unix:{tmp_path / 'nobody-listens.sock'}"
        async with open_memory_connect(address, tmp_path / "editor", token=TOKEN) as editor:
            await editor.request(41, "initialize", INITIALIZE)
            answer = await editor.response_to(41)
            assert await editor.wait() == 1
    assert answer["error"]["code"] == -32000
    assert "cannot reach the sidecar" in answer["error"]["message"]
    assert "nobody-listens.sock" in answer["error"]["message"]


async def test_a_sidecar_at_its_connection_cap_answers_initialize_by_its_id(
    tmp_path: Path,
) -> None:
    limits = ServeLimits(max_connections=1)
    with trio.fail_after(30):
        async with sidecar(tmp_path, limits=limits) as address:
            host, port = address.removeprefix("tcp://").rsplit(":", 1)
            holder = await trio.open_tcp_stream(host, int(port))  # takes the only slot
            await trio.sleep(0.2)
            async with open_memory_connect(address, tmp_path / "editor", token=TOKEN) as editor:
                await editor.request(5, "initialize", INITIALIZE)
                answer = await editor.response_to(5)
                assert await editor.wait() == 1
            await holder.aclose()
    assert answer["error"]["code"] == -32000
    assert "limit of 1 connections" in answer["error"]["message"]


async def test_connect_exits_when_the_sidecar_goes_away(tmp_path: Path) -> None:
    spawner = ScriptedSpawner()
    with trio.fail_after(30):
        async with (
            stoppable_sidecar(tmp_path, spawner) as (address, cancel),
            open_memory_connect(address, tmp_path / "editor", token=TOKEN) as editor,
        ):
            await editor.request(0, "initialize", INITIALIZE)
            await editor.response_to(0)
            (agent,) = spawner.agents
            cancel.set()  # the sidecar shuts down: its agent stops, the socket closes
            assert await editor.read_to_eof() == []
            # The editor did not leave: the sidecar going away is a failure to report.
            assert await editor.wait() == 1
    assert agent.returncode is not None  # it has exited


HANG = {"jsonrpc": "2.0", "id": "turn-1", "method": "_test/hang", "params": {}}


async def test_a_turn_in_flight_when_the_sidecar_stops_gets_an_error(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            stoppable_sidecar(tmp_path) as (address, cancel),
            open_memory_connect(address, tmp_path / "editor", token=TOKEN) as editor,
        ):
            await editor.request(0, "initialize", INITIALIZE)
            await editor.response_to(0)
            await editor.send(HANG)  # a turn the agent never ends
            await editor.request(1, "session/new", {"cwd": "/", "mcpServers": []})
            await editor.response_to(1)
            cancel.set()
            lines = await editor.read_to_eof()
            assert await editor.wait() == 1
    (answer,) = [json.loads(line) for line in lines]
    assert answer["id"] == "turn-1" and answer["error"]["code"] == -32603
    assert "sidecar closed the connection" in answer["error"]["message"]


async def test_a_turn_in_flight_when_the_sidecar_is_killed_gets_an_error(tmp_path: Path) -> None:
    socket_path = tmp_path / "sidecar.sock"
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    argv = ["serve", "--state", ":memory:",
            "--listen", f"unix:{socket_path}", "--", *fake_agent_argv(agent_dir)]  # fmt: skip
    with trio.fail_after(30):
        server = await start_bridge(argv, env=bridge_env(tmp_path))
        try:
            await wait_listening(socket_path)
            async with open_connect(f"unix:{socket_path}", tmp_path / "editor") as editor:
                await editor.request(0, "initialize", INITIALIZE)
                await editor.response_to(0)
                await editor.send({**HANG, "id": 7})
                await editor.send({**HANG, "id": "7"})
                await editor.request(8, "session/new", {"cwd": "/", "mcpServers": []})
                await editor.response_to(8)
                server.kill()
                lines = await editor.read_to_eof()
                assert await editor.wait() == 1
        finally:
            server.kill()
            await server.wait()
    answers = [json.loads(line) for line in lines]
    assert [a["id"] for a in answers] == [7, "7"]
    assert all(a["error"]["code"] == -32603 for a in answers)


def test_with_token_adds_it_next_to_existing_meta() -> None:
    line = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "initialize",
            "params": {"protocolVersion": 1, "_meta": {"zed": True, "acp-bridge": {"x": 1}}},
        }
    ).encode()
    changed = json.loads(with_token(line, "t"))
    assert changed["params"]["_meta"] == {"zed": True, "acp-bridge": {"x": 1, "token": "t"}}
    # A lone surrogate is valid JSON text; the changed line stays valid JSON.
    odd = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"\\ud800"}}'
    assert json.loads(with_token(odd, "t"))["params"]["x"] == "\ud800"
    # Anything that is not an initialize request passes unchanged.
    for other in (b"not json", b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}'):
        assert with_token(other, "t") == other


def test_the_token_is_never_an_argument() -> None:
    # connect has no --token option: argv is readable by every local user.
    done = CliRunner().invoke(main, ["connect", "--help"], prog_name="acp-bridge").output
    assert "--token-file" in done
    assert "--token " not in done and "--token\n" not in done


@asynccontextmanager
async def scripted_sidecar(chunks: list[bytes]) -> AsyncIterator[str]:
    """A TCP peer that reads the first line, writes ``chunks`` one by one, then closes."""

    async def handle(stream: trio.SocketStream) -> None:
        received = b""
        while b"\n" not in received:
            received += await stream.receive_some(65536)
        for chunk in chunks:
            await stream.send_all(chunk)
            await trio.sleep(0.05)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        serve_tcp = partial(trio.serve_tcp, handle, 0, host="127.0.0.1")
        listeners = await nursery.start(serve_tcp)
        yield f"tcp://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        nursery.cancel_scope.cancel()


async def test_a_sidecar_that_closes_before_answering_yields_an_error(tmp_path: Path) -> None:
    # A notification, then half a line: neither answers the initialize.
    chunks = [b'{"jsonrpc":"2.0","method":"x/note"}\n', b'{"jsonrpc":"2.0","id":']
    with trio.fail_after(20):
        async with (
            scripted_sidecar(chunks) as address,
            open_memory_connect(address, tmp_path / "editor") as editor,
        ):
            await editor.request(8, "initialize", INITIALIZE)
            lines = await editor.read_to_eof()
            assert await editor.wait() == 1
    assert lines[0] == b'{"jsonrpc":"2.0","method":"x/note"}'
    answer = json.loads(lines[1])
    assert answer["id"] == 8 and "before answering initialize" in answer["error"]["message"]
    assert len(lines) == 2


async def test_an_answer_split_across_reads_is_passed_on_unchanged(tmp_path: Path) -> None:
    answer = b'{"jsonrpc":"2.0", "id":8,"result":{"protocolVersion":1}}\r\n'
    after = b'{"jsonrpc":"2.0","method":"x/after"}\n'
    chunks = [answer[:10], answer[10:30], answer[30:] + after[:5], after[5:]]
    with trio.fail_after(20):
        async with (
            scripted_sidecar(chunks) as address,
            open_memory_connect(address, tmp_path / "editor") as editor,
        ):
            await editor.request(8, "initialize", INITIALIZE)
            await editor.read_to_eof()
            assert await editor.wait() == 1  # the sidecar left while the editor stayed
    assert bytes(editor.received) == answer + after


def test_outstanding_keeps_the_editors_requests_until_the_sidecar_answers_them() -> None:
    outstanding = Outstanding()
    editor = [
        b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{}}',
        b'{"jsonrpc":"2.0","id":"1","method":"session/prompt","params":{}}',
        b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}',
        # The editor's answer to a request of the agent's is no request of its own.
        b'{"jsonrpc":"2.0","id":5,"result":{"outcome":{"outcome":"cancelled"}}}',
        b'[{"jsonrpc":"2.0","id":2,"method":"a","params":{}},{"jsonrpc":"2.0","id":3,"method":[]}]',
        b'{"jsonrpc":"2.0","\\u0069d":4,"method":"escaped","params":{}}',
    ]
    data = b"\n".join(editor) + b"\n"
    for start in range(0, len(data), 7):  # in pieces that cut lines anywhere
        outstanding.from_editor(data[start : start + 7])
    assert outstanding.unanswered() == [1, "1", 2, 4]
    # A request of the agent's with an id the editor also uses answers nothing.
    outstanding.from_sidecar(b'{"jsonrpc":"2.0","id":1,"method":"fs/read","params":{}}\n')
    outstanding.from_sidecar(b'{"jsonrpc":"2.0","id":"1","result":{}}\n{"jsonrpc":"2.0",')
    assert outstanding.unanswered() == [1, 2, 4]
    outstanding.from_sidecar(b'"id":2,"error":{"code":-1,"message":"x"}}\n')
    assert outstanding.unanswered() == [1, 4]


def test_outstanding_reads_a_long_line_in_pieces() -> None:
    outstanding = Outstanding()
    text = "x" * (1 << 20)
    request = {"jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": {"t": text}}
    line = json.dumps(request)
    data = line.encode() + b"\n"
    for start in range(0, len(data), 65536):
        outstanding.from_editor(data[start : start + 65536])
    assert outstanding.unanswered() == [9]
    answer = json.dumps({"jsonrpc": "2.0", "id": 9, "result": {"t": text}}).encode() + b"\n"
    for start in range(0, len(answer), 65536):
        outstanding.from_sidecar(answer[start : start + 65536])
    assert outstanding.unanswered() == []
