"""``acp-bridge serve``: the sidecar mode. Each connection gets its own agent process.

Listeners are a unix socket (mode 0600) or TCP. Loopback needs no credentials; a TCP
listener on any other address refuses to start without a token, and then every client must
present it in its ``initialize`` request as ``params._meta["acp-bridge"].token``. The token
is removed before the request reaches the agent.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio

from acp_bridge import jsonrpc
from acp_bridge.framing import Line, LineSplitter
from acp_bridge.lifecycle import Lifecycle
from acp_bridge.registry import AdapterRegistry
from acp_bridge.relay import Bridge, BridgeOptions
from acp_bridge.store import SessionStore

log = logging.getLogger("acp_bridge.serve")

# The first line of a token-protected connection is an initialize request: small. A
# client that sends more than this before proving itself is cut off.
PREAMBLE_LIMIT: Final = 1 << 20
AUTH_FAILED: Final = -32000


class ListenError(ValueError):
    pass


@dataclass(frozen=True)
class ListenAddress:
    scheme: str  # "unix" or "tcp"
    path: str = ""
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, value: str) -> ListenAddress:
        if value.startswith("unix:"):
            path = value[len("unix:") :]
            if not path:
                raise ListenError("unix: needs a socket path, e.g. unix:/run/acp-bridge.sock")
            return cls("unix", path=path)
        if value.startswith("tcp://"):
            host, sep, port = value[len("tcp://") :].rpartition(":")
            if not sep or not port.isdigit():
                raise ListenError(f"{value!r}: expected tcp://HOST:PORT")
            return cls("tcp", host=host.strip("[]") or "127.0.0.1", port=int(port))
        raise ListenError(f"{value!r}: expected unix:PATH or tcp://HOST:PORT")

    @property
    def loopback(self) -> bool:
        if self.scheme == "unix":
            return True
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.scheme == "unix" else f"tcp://{self.host}:{self.port}"


class ReplayStream(trio.abc.ReceiveStream):
    """A receive stream that first yields bytes already read from it."""

    def __init__(self, prefix: bytes, inner: trio.abc.ReceiveStream) -> None:
        self.prefix = prefix
        self.inner = inner

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.prefix:
            chunk, self.prefix = self.prefix, b""
            return chunk
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def check_token(line: bytes, token: str) -> bytes | None:
    """The initialize line without the token if it carries the right one, else None."""
    try:
        message = json.loads(line)
        meta = message["params"]["_meta"]
        presented = meta["acp-bridge"]["token"]
    except (ValueError, KeyError, TypeError):
        return None
    if message.get("method") != "initialize" or not isinstance(presented, str):
        return None
    if not hmac.compare_digest(presented.encode(), token.encode()):
        return None
    bridge_meta = {k: v for k, v in meta["acp-bridge"].items() if k != "token"}
    meta = {k: v for k, v in meta.items() if k != "acp-bridge"}
    if bridge_meta:
        meta["acp-bridge"] = bridge_meta
    params = {**message["params"], "_meta": meta}
    if not meta:
        del params["_meta"]
    return jsonrpc.encode({**message, "params": params})


async def read_preamble(stream: trio.abc.ReceiveStream) -> tuple[bytes, bytes] | None:
    """Read the first line; return it and whatever came after it, or None at EOF/too long."""
    splitter = LineSplitter(PREAMBLE_LIMIT)
    received = b""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return None
        received += data
        newline = received.find(b"\n")
        if newline >= 0:
            items = splitter.feed(received[: newline + 1])
            first = items[0]
            if not isinstance(first, Line):
                return None
            return first.data, received[newline + 1 :]
        if len(received) > PREAMBLE_LIMIT:
            return None


class Server:
    def __init__(
        self,
        options: BridgeOptions,
        store: SessionStore,
        registry: AdapterRegistry,
        token: str | None,
    ) -> None:
        self.options = options
        self.store = store
        self.registry = registry
        self.token = token

    async def handle(self, stream: trio.SocketStream) -> None:
        receive: trio.abc.ReceiveStream = stream
        try:
            if self.token is not None:
                preamble = await read_preamble(stream)
                first = check_token(preamble[0], self.token) if preamble else None
                if preamble is None or first is None:
                    request_id = None
                    if preamble is not None:
                        try:
                            request_id = json.loads(preamble[0]).get("id")
                        except (ValueError, AttributeError):
                            request_id = None
                    log.warning("refused a connection without a valid token")
                    error = jsonrpc.error_response(
                        request_id, AUTH_FAILED, "The connection needs a valid acp-bridge token."
                    )
                    await stream.send_all(jsonrpc.encode(error) + b"\n")
                    return
                receive = ReplayStream(first + b"\n" + preamble[1], stream)
            lifecycle = Lifecycle.for_command(self.store, self.options.agent_argv)
            bridge = Bridge(self.options, receive, stream, lifecycle, registry=self.registry)
            status = await bridge.run(watch_signals=False)
            log.info("connection closed; agent status %d", status)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info("connection dropped")
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def open_listeners(address: ListenAddress) -> list[trio.SocketListener]:
    if address.scheme == "tcp":
        return await trio.open_tcp_listeners(address.port, host=address.host)
    path = Path(address.path)
    if path.is_socket():
        path.unlink()  # a stale socket from an earlier run
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket file is created 0600
    try:
        await sock.bind(str(path))
    finally:
        os.umask(old_umask)
    sock.listen(128)
    return [trio.SocketListener(sock)]


async def serve(
    server: Server,
    address: ListenAddress,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    listeners = await open_listeners(address)
    log.warning("listening on %s", address)
    try:
        async with trio.open_nursery() as nursery:
            started = await nursery.start(trio.serve_listeners, server.handle, listeners)
            task_status.started(started)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
                async for signum in signals:
                    log.warning("signal %d: closing connections", signum)
                    nursery.cancel_scope.cancel()
                    break
    finally:
        if address.scheme == "unix":
            Path(address.path).unlink(missing_ok=True)
