"""The sidecar mode: one agent per connection, private unix sockets, tokens off loopback."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
import trio

from acp_bridge.client import ClientRequestError, connect
from acp_bridge.registry import AdapterRegistry
from acp_bridge.relay import BridgeOptions
from acp_bridge.serve import ListenAddress, ListenError, Server, check_token, serve
from acp_bridge.store import SessionStore

FAKE_AGENT = str(Path(__file__).with_name("fake_agent.py"))


def make_server(tmp_path: Path, token: str | None = None) -> Server:
    options = BridgeOptions(
        agent_argv=[sys.executable, FAKE_AGENT, "--record", str(tmp_path / "agent.log")],
        shutdown_grace=0.5,
    )
    return Server(options, SessionStore(":memory:"), AdapterRegistry(), token)


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
