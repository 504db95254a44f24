"""The sidecar mode: one agent per connection, private unix sockets, tokens off loopback.

The server runs in this process with the fake agent as a coroutine; the command line's own
tests, and the one reading an agent's environment, start processes.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import preloaded
import pytest
import trio
from memory_agent import FAKE_PYTHON, ScriptedSpawner
from sidecar import wait_listening

from acp_bridge.commands.serve import (
    ListenAddress,
    ListenError,
    ServeLimits,
    Server,
    check_token,
    open_listeners,
    serve,
)
from acp_bridge.registry import AdapterRegistry
from acp_bridge.runtime.client import ClientRequestError, connect
from acp_bridge.runtime.relay import BridgeOptions, Spawner, spawn_process
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore

FAKE_AGENT = str(Path(__file__).with_name("fake_agent.py"))


def make_server(
    tmp_path: Path,
    token: str | None = None,
    *,
    limits: ServeLimits | None = None,
    pidfile: bool = False,
    spawner: Spawner | None = None,
) -> Server:
    """A server whose agents are the fake agent run as coroutines, unless ``spawner`` says
    otherwise."""
    argv = [*FAKE_PYTHON, FAKE_AGENT, "--record", str(tmp_path / "agent.log")]
    if pidfile:
        argv += ["--pidfile", str(tmp_path / "agent.pid")]
    options = BridgeOptions(agent_argv=argv, shutdown_grace=0.5)
    store, registry = SessionStore(":memory:"), AdapterRegistry()
    return Server(options, store, registry, token, limits, spawner=spawner or ScriptedSpawner())


def test_listen_address_parsing() -> None:
    assert ListenAddress.parse("unix:/run/x.sock") == ListenAddress("unix", path="/run/x.sock")
    tcp = ListenAddress.parse("tcp://127.0.0.1:4000")
    assert (tcp.host, tcp.port, tcp.loopback) == ("127.0.0.1", 4000, True)
    assert ListenAddress.parse("tcp://[::1]:4000").loopback
    assert not ListenAddress.parse("tcp://0.0.0.0:4000").loopback
    for bad in ("unix:", "tcp://host", "http://x:1", "tcp://h:port"):
        with pytest.raises(ListenError):
            ListenAddress.parse(bad)


def test_token_is_checked_and_removed_before_the_agent_sees_it() -> None:
    line = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": 1, "_meta": {"acp-bridge": {"token": "s3cret"}}},
        }
    ).encode()
    assert check_token(line, "wrong") is None
    forwarded = check_token(line, "s3cret")
    assert forwarded is not None
    assert json.loads(forwarded)["params"] == {"protocolVersion": 1}
    assert check_token(b'{"jsonrpc":"2.0","id":0,"method":"initialize"}', "s3cret") is None
    assert check_token(b"not json", "s3cret") is None
    lone_surrogate = line.replace(b"s3cret", b"\\ud800")
    assert b'"\\ud800"' in lone_surrogate
    assert check_token(lone_surrogate, "s3cret") is None


async def test_each_unix_connection_gets_its_own_agent(tmp_path: Path) -> None:
    socket_path = tmp_path / "bridge.sock"
    server = make_server(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, server, ListenAddress("unix", path=str(socket_path)))
            assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
            infos = []
            for _ in range(2):
                stream = await trio.open_unix_socket(str(socket_path))
                async with connect(stream, stream) as client:
                    result = await client.request("initialize", {"protocolVersion": 1})
                    session = await client.request("session/new", {"cwd": "/", "mcpServers": []})
                    infos.append((result["agentCapabilities"]["_meta"]["acp-bridge"], session))
                await stream.aclose()
            nursery.cancel_scope.cancel()
    # A fresh agent per connection: both numbered their first session sess-1.
    assert [session for _, session in infos] == [{"sessionId": "sess-1"}] * 2
    assert not socket_path.exists()


async def test_tcp_connection_without_the_token_is_refused(tmp_path: Path) -> None:
    server = make_server(tmp_path, token="s3cret")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(serve, server, ListenAddress("tcp", "", "127.0.0.1", 0))
            port = listeners[0].socket.getsockname()[1]

            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with connect(stream, stream) as client:
                with pytest.raises(ClientRequestError) as refused:
                    await client.request("initialize", {"protocolVersion": 1})
            assert refused.value.code == -32000

            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with connect(stream, stream) as client:
                params = {"protocolVersion": 1, "_meta": {"acp-bridge": {"token": "s3cret"}}}
                result = await client.request("initialize", params)
            assert result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}
            await stream.aclose()
            nursery.cancel_scope.cancel()
    # Only the authenticated connection reached an agent, and without the token.
    received = (tmp_path / "agent.log").read_text().splitlines()
    assert len(received) == 1 and "s3cret" not in received[0]


# --------------------------------------------------------------- bounds and hardening


async def receive_all(stream: trio.abc.ReceiveStream) -> bytes:
    """Everything the server writes until it closes the connection."""
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


@asynccontextmanager
async def running(server: Server, address: ListenAddress) -> AsyncIterator[ListenAddress]:
    """``serve`` in the background; yields the address it really listens on."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve, server, address)
        if address.scheme == "tcp":
            port = listeners[0].socket.getsockname()[1]
            address = ListenAddress("tcp", host="127.0.0.1", port=port)
        yield address
        nursery.cancel_scope.cancel()


async def open_stream(address: ListenAddress) -> trio.SocketStream:
    if address.scheme == "unix":
        return await trio.open_unix_socket(address.path)
    return await trio.open_tcp_stream(address.host, address.port)


TCP = ListenAddress("tcp", host="127.0.0.1")


async def test_a_peer_that_never_sends_initialize_is_cut_off(tmp_path: Path) -> None:
    server = make_server(tmp_path, token="s3cret", limits=ServeLimits(initialize_deadline=0.5))
    with trio.fail_after(10):
        async with running(server, TCP) as address:
            idle = await open_stream(address)
            slow = await open_stream(address)
            await slow.send_all(b'{"jsonrpc":"2.0",')  # and never the rest
            start = trio.current_time()
            answers = [await receive_all(idle), await receive_all(slow)]
            elapsed = trio.current_time() - start
    assert elapsed < 2
    for answer in answers:
        error = json.loads(answer)
        assert error["id"] is None and error["error"]["code"] == -32000
        assert "no initialize request within 0.5s" in error["error"]["message"]


async def test_connections_over_the_cap_are_refused(tmp_path: Path) -> None:
    server = make_server(tmp_path, limits=ServeLimits(max_connections=2))
    with trio.fail_after(10):
        async with running(server, TCP) as address:
            held = [await open_stream(address) for _ in range(2)]
            await trio.sleep(0.2)
            extra = await open_stream(address)
            refusal = json.loads(await receive_all(extra))
            assert "limit of 2 connections" in refusal["error"]["message"]
            # A slot freed is a slot to use again.
            await held.pop().aclose()
            await trio.sleep(0.2)
            stream = await open_stream(address)
            async with connect(stream, stream) as client:
                await client.request("initialize", {"protocolVersion": 1})
            await stream.aclose()


async def test_the_first_line_has_a_small_limit_before_authentication(tmp_path: Path) -> None:
    server = make_server(tmp_path, token="s3cret")
    with trio.fail_after(10):
        async with running(server, TCP) as address:
            stream = await open_stream(address)
            # 100 KiB without a newline: well under the 64 MiB line limit, over the preamble's.
            with suppress(trio.BrokenResourceError):
                await stream.send_all(b"x" * (100 * 1024))
            refusal = json.loads(await receive_all(stream))
    assert refusal["error"]["code"] == -32000
    assert "at most 65536 bytes" in refusal["error"]["message"]


async def test_a_second_server_does_not_take_over_a_live_unix_socket(tmp_path: Path) -> None:
    address = ListenAddress("unix", path=str(tmp_path / "bridge.sock"))
    with trio.fail_after(10):
        async with running(make_server(tmp_path), address):
            with pytest.raises(OSError, match="another server is listening"):
                await open_listeners(address)
            # The first server still answers on its socket.
            stream = await open_stream(address)
            async with connect(stream, stream) as client:
                await client.request("initialize", {"protocolVersion": 1})
            await stream.aclose()


async def test_a_stale_unix_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "bridge.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    with trio.fail_after(10):
        async with running(make_server(tmp_path), ListenAddress("unix", path=str(path))) as address:
            stream = await open_stream(address)
            async with connect(stream, stream) as client:
                await client.request("initialize", {"protocolVersion": 1})
            await stream.aclose()


async def test_the_agent_environment_has_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACP_BRIDGE_TOKEN", "s3cret")
    # What a process sees in its environment: a process.
    server = make_server(tmp_path, token="s3cret", pidfile=True, spawner=spawn_process)
    with trio.fail_after(20):
        async with running(server, TCP) as address:
            stream = await open_stream(address)
            async with connect(stream, stream) as client:
                params = {"protocolVersion": 1, "_meta": {"acp-bridge": {"token": "s3cret"}}}
                await client.request("initialize", params)
                pid = int((tmp_path / "agent.pid").read_text())
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            await stream.aclose()
    assert b"ACP_BRIDGE_TOKEN" not in environ and b"s3cret" not in environ


async def test_a_token_sent_to_a_server_without_one_does_not_reach_the_agent(
    tmp_path: Path,
) -> None:
    with trio.fail_after(20):
        async with running(make_server(tmp_path), TCP) as address:
            stream = await open_stream(address)
            async with connect(stream, stream) as client:
                params = {"protocolVersion": 1, "_meta": {"acp-bridge": {"token": "s3cret"}}}
                await client.request("initialize", params)
            await stream.aclose()
    received = (tmp_path / "agent.log").read_text()
    assert "initialize" in received and "s3cret" not in received


async def test_an_odd_but_valid_initialize_does_not_stop_the_server(tmp_path: Path) -> None:
    server = make_server(tmp_path, token="s3cret")
    # A lone surrogate escape is valid JSON; the line without the token is written again.
    line = (
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,'
        b'"clientInfo":{"name":"\\ud800"},"_meta":{"acp-bridge":{"token":"s3cret"}}}}\n'
    )
    with trio.fail_after(20):
        async with running(server, TCP) as address:
            for _ in range(2):
                stream = await open_stream(address)
                await stream.send_all(line)
                answer = json.loads((await stream.receive_some(65536)).splitlines()[0])
                assert answer["id"] == 1 and "result" in answer
                await stream.aclose()


async def test_a_probe_that_connects_and_leaves_starts_no_agent(tmp_path: Path) -> None:
    # What a Kubernetes tcpSocket probe does, every few seconds.
    with trio.fail_after(10):
        async with running(make_server(tmp_path, pidfile=True), TCP) as address:
            for _ in range(3):
                await (await open_stream(address)).aclose()
            await trio.sleep(0.5)
    assert not (tmp_path / "agent.pid").exists()


async def said_until(process: preloaded.PreloadedProcess, words: bytes) -> bytes:
    """What the command wrote on stderr until a whole line holds ``words`` (or until its
    end, or 20 s); then it is stopped with SIGTERM and waited for."""
    assert process.stderr is not None
    said = b""
    try:
        with trio.move_on_after(20):
            # Until the line that holds ``words`` (any line, for b"") is whole.
            while (at := said.find(words)) < 0 or b"\n" not in said[at:]:
                chunk = await process.stderr.receive_some()
                if not chunk:
                    break
                said += chunk
    finally:
        process.terminate()
        with trio.fail_after(10):
            await process.wait()
    return said


# The commands below run as processes of their own, forked from one that has imported
# the bridge (``preloaded``): what comes after the interpreter's start is the same.


async def test_a_token_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    socket_path = tmp_path / "s.sock"
    argv = ["serve", "--state", ":memory:"]
    argv += ["--log-level", "info", "--listen", f"unix:{socket_path}", "--token", "s3cret"]
    argv += ["--", sys.executable]
    process = await preloaded.start_bridge(argv, env=env, stderr=subprocess.PIPE)
    said = (await said_until(process, b"listening on")).decode()
    assert "visible to every local user" in said, said


async def test_the_command_reads_the_token_from_a_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    socket_path = tmp_path / "s.sock"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    env.pop("ACP_BRIDGE_TOKEN", None)
    argv = ["serve", "--state", ":memory:"]
    argv += ["--listen", f"unix:{socket_path}", "--token-file", str(token_file)]
    argv += ["--max-connections", "4", "--", *FAKE_PYTHON, FAKE_AGENT]
    process = await preloaded.start_bridge(argv, env=env)
    try:
        with trio.fail_after(20):
            await wait_listening(socket_path)
            answers = []
            for token in ("wrong", "from-a-file"):
                stream = await trio.open_unix_socket(str(socket_path))
                async with connect(stream, stream) as client:
                    params = {"protocolVersion": 1, "_meta": {"acp-bridge": {"token": token}}}
                    try:
                        answers.append(await client.request("initialize", params))
                    except ClientRequestError as exc:
                        answers.append(exc.code)
                await stream.aclose()
    finally:
        process.terminate()
        with trio.fail_after(10):
            await process.wait()
    assert answers[0] == -32000
    assert answers[1]["protocolVersion"] == 1


async def test_a_token_that_cannot_be_encoded_is_refused_and_the_server_stays(
    tmp_path: Path,
) -> None:
    # "\ud800" is valid JSON for a lone surrogate, which has no UTF-8 encoding.
    line = (
        b'{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":1,'
        b'"_meta":{"acp-bridge":{"token":"\\ud800"}}}}\n'
    )
    server = make_server(tmp_path, token="s3cret")
    with trio.fail_after(20):
        async with running(server, TCP) as address:
            stream = await open_stream(address)
            await stream.send_all(line)
            refusal = json.loads(await receive_all(stream))
            assert refusal["id"] == 7 and refusal["error"]["code"] == -32000
            await stream.aclose()
            stream = await open_stream(address)
            async with connect(stream, stream) as client:
                params = {"protocolVersion": 1, "_meta": {"acp-bridge": {"token": "s3cret"}}}
                await client.request("initialize", params)
            await stream.aclose()


async def test_one_connection_that_fails_does_not_end_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = Lifecycle.for_command
    calls = 0

    def fail_once(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a fault in one connection")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Lifecycle, "for_command", fail_once)
    with trio.fail_after(20):
        async with running(make_server(tmp_path), TCP) as address:
            broken = await open_stream(address)
            await broken.send_all(
                b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
            )
            assert await receive_all(broken) == b""
            await broken.aclose()
            stream = await open_stream(address)
            async with connect(stream, stream) as client:
                await client.request("initialize", {"protocolVersion": 1})
            await stream.aclose()
    assert calls == 2
    assert "a fault in one connection" in caplog.text


@pytest.mark.parametrize("scheme", ["unix", "tcp"])
async def test_serve_says_where_it_listens_at_the_default_log_level(
    tmp_path: Path, scheme: str
) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    env.pop("ACP_BRIDGE_TOKEN", None)
    listen = f"unix:{tmp_path / 's.sock'}" if scheme == "unix" else "tcp://127.0.0.1:0"
    argv = ["serve", "--state", ":memory:", "--listen", listen, "--", *FAKE_PYTHON, FAKE_AGENT]
    process = await preloaded.start_bridge(argv, env=env, stderr=subprocess.PIPE)
    said = await said_until(process, b"")
    first = said.decode().partition("\n")[0]
    assert first.startswith(f"acp-bridge: listening on {scheme}"), said
    if scheme == "unix":
        assert first == f"acp-bridge: listening on {listen}"
    else:  # the port the system gave
        port = int(first.rpartition(":")[2])
        assert port > 0


def test_the_stdio_modes_stay_silent_at_the_default_log_level(tmp_path: Path) -> None:
    init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    done = preloaded.run_to_end(["--", *FAKE_PYTHON, FAKE_AGENT], stdin=init, env=env)
    assert done.returncode == 0 and done.stderr == b"", done.stderr


async def test_the_unix_socket_appears_only_once_it_accepts_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An editor that connects as soon as the socket file exists must not be refused: the
    # file is put in place only after listen(), never between bind() and listen().
    path = tmp_path / "bridge.sock"
    seen_at_listen: list[bool] = []
    with trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        concrete = type(probe)
    listen = concrete.listen

    def watching_listen(self: trio.socket.SocketType, backlog: int = 128) -> None:
        seen_at_listen.append(path.exists())
        listen(self, backlog)

    monkeypatch.setattr(concrete, "listen", watching_listen)
    listeners = await open_listeners(ListenAddress("unix", path=str(path)))
    try:
        assert seen_at_listen == [False]
        assert path.is_socket() and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bridge.sock"]
        client = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with client:
            await client.connect(str(path))
    finally:
        for listener in listeners:
            await listener.aclose()


async def test_a_file_at_the_socket_path_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "bridge.sock"
    path.write_text("not a socket")
    with pytest.raises(OSError, match="exists and is not a socket"):
        await open_listeners(ListenAddress("unix", path=str(path)))
    assert path.read_text() == "not a socket"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bridge.sock"]
