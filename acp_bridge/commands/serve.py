"""``acp-bridge serve``: the sidecar mode. Each connection gets its own agent process.

Listeners are a unix socket (mode 0600) or TCP. Loopback needs no credentials; a TCP
listener on any other address refuses to start without a token, and then every client must
present it in its ``initialize`` request as ``params._meta["acp-bridge"].token``
(``acp-bridge connect`` adds it). The token never reaches the agent: it is removed from the
request, and from the environment the agent processes inherit.

What an unauthenticated peer can cost is bounded: the first line (the ``initialize``) must
arrive within a deadline and fit a small limit, and the number of open connections is capped.
A unix socket another live server is using is never taken over.
"""

from __future__ import annotations

import dataclasses
import errno
import hmac
import ipaddress
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import trio

from acp_bridge.registry import AdapterRegistry
from acp_bridge.runtime.agents import Spawner, spawn_process
from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import FrameError, Kind, RequestId

log = logging.getLogger("acp_bridge.commands.serve")
# The longest path a unix socket can be bound to (sun_path, less its terminating NUL).
UNIX_PATH_MAX: Final = 107

TOKEN_ENV: Final = "ACP_BRIDGE_TOKEN"
# Where clients put the token: params._meta["acp-bridge"].token of their initialize.
META_KEY: Final = "acp-bridge"
# Refusals of a connection (bad token, over the cap, too slow): a server error code.
CONNECTION_REFUSED: Final = -32000
# How long, and how many bytes, a refused peer still gets so that it reads the refusal.
REFUSAL_LINGER: Final = 1.0
REFUSAL_DRAIN: Final = 1 << 20


@dataclass(frozen=True)
class ServeLimits:
    """What one peer may cost before its ``initialize`` has been accepted."""

    # An initialize request is a few hundred bytes; 64 KiB leaves room for large
    # clientInfo/_meta while keeping idle peers cheap.
    preamble_limit: int = 64 * 1024
    initialize_deadline: float = 10.0
    # Every connection costs an agent process (a node runtime is ~100 MB), so the cap is
    # about memory more than sockets.
    max_connections: int = 32


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


def encode_changed(message: Any) -> bytes:
    """Serialise a frame the sidecar changed; text that only survives escaped is escaped.

    A lone surrogate arrives legally as ``"\\ud800"`` but cannot be written as UTF-8.
    """
    try:
        return jsonrpc.encode(message)
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":")).encode()


def parse_initialize(line: bytes) -> dict[str, Any] | None:
    """The message on ``line`` if it is an ``initialize`` request with object params."""
    try:
        frame = jsonrpc.parse(line)
    except FrameError:
        return None
    message = frame.message
    if frame.kind is not Kind.REQUEST or message.get("method") != "initialize":
        return None
    if not isinstance(message.get("params"), dict):
        return None
    return message  # type: ignore[no-any-return]


def request_id_of(line: bytes) -> RequestId:
    """The id of the request on ``line`` when it can be read, for an error answer."""
    try:
        frame = jsonrpc.parse(line)
    except FrameError as exc:
        return exc.request_id
    request_id = frame.message.get("id") if frame.kind is Kind.REQUEST else None
    return request_id if jsonrpc.is_request_id(request_id) else None


def presented_token(message: dict[str, Any]) -> object:
    meta = message["params"].get("_meta")
    bridge_meta = meta.get(META_KEY) if isinstance(meta, dict) else None
    return bridge_meta.get("token") if isinstance(bridge_meta, dict) else None


def without_token(message: dict[str, Any]) -> dict[str, Any]:
    """The initialize request without ``_meta["acp-bridge"].token`` (and emptied parents)."""
    params = dict(message["params"])
    meta = dict(params["_meta"])
    bridge_meta = {k: v for k, v in meta[META_KEY].items() if k != "token"}
    if bridge_meta:
        meta[META_KEY] = bridge_meta
    else:
        del meta[META_KEY]
    if meta:
        params["_meta"] = meta
    else:
        del params["_meta"]
    return {**message, "params": params}


def as_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def check_token(line: bytes, token: str) -> bytes | None:
    """The initialize line without the token if it carries the right one, else None."""
    message = parse_initialize(line)
    if message is None:
        return None
    presented = presented_token(message)
    if not isinstance(presented, str):
        return None
    # "surrogatepass": a lone surrogate is valid JSON ("\\ud800") but has no UTF-8 form; it
    # must compare unequal, not raise.
    if not hmac.compare_digest(as_bytes(presented), as_bytes(token)):
        return None
    return encode_changed(without_token(message))


def strip_token(line: bytes) -> bytes:
    """``line`` unchanged, unless it is an initialize carrying a token the agent must not see."""
    message = parse_initialize(line)
    if message is None or presented_token(message) is None:
        return line
    return encode_changed(without_token(message))


@dataclass(frozen=True)
class Preamble:
    """The first line a peer sent (without its terminator) and the bytes read after it."""

    line: bytes
    rest: bytes


class PreambleTooLong(Exception):
    pass


async def read_preamble(stream: trio.abc.ReceiveStream, limit: int) -> Preamble | None:
    """Read the first line, holding at most ``limit`` bytes; None at EOF before a line."""
    received = bytearray()
    while True:
        data = await stream.receive_some(limit + 2 - len(received))
        if not data:
            return None
        newline = data.find(b"\n")
        if newline >= 0:
            line = bytes(received + data[:newline])
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > limit:
                raise PreambleTooLong
            return Preamble(line, bytes(data[newline + 1 :]))
        received += data
        if len(received) > limit + 1:  # one spare byte for a "\r"
            raise PreambleTooLong


def drop_token_from_environment() -> None:
    """Keep the token out of the agents' environment (they inherit the sidecar's).

    Any tool an agent runs could read it otherwise; the sidecar has read it already.
    """
    os.environ.pop(TOKEN_ENV, None)


class Server:
    def __init__(
        self,
        options: BridgeOptions,
        store: SessionStore,
        registry: AdapterRegistry,
        token: str | None,
        limits: ServeLimits | None = None,
        *,
        spawner: Spawner = spawn_process,
    ) -> None:
        self.options = options
        self.store = store
        self.registry = registry
        self.token = token
        self.limits = limits or ServeLimits()
        self.spawner = spawner  # starts each connection's agent processes
        self.connections = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one connection; whatever goes wrong in it ends that connection only."""
        try:
            if self.connections >= self.limits.max_connections:
                log.warning(
                    "refused a connection: %d connections open", self.limits.max_connections
                )
                await self._refuse(
                    stream,
                    None,
                    "acp-bridge serve is at its limit of "
                    f"{self.limits.max_connections} connections; try again later.",
                )
                return
            self.connections += 1
            try:
                await self._serve_connection(stream)
            finally:
                self.connections -= 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info("connection dropped")
        except Exception:
            # trio.serve_listeners would end the server, and every other connection, with it.
            log.exception("a connection failed; the server goes on")
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        limits = self.limits
        try:
            with trio.fail_after(limits.initialize_deadline):
                preamble = await read_preamble(stream, limits.preamble_limit)
        except trio.TooSlowError:
            deadline = limits.initialize_deadline
            log.warning("refused a connection: no initialize within %gs", deadline)
            await self._refuse(
                stream,
                None,
                f"acp-bridge serve: no initialize request within {limits.initialize_deadline:g}s.",
            )
            return
        except PreambleTooLong:
            log.warning("refused a connection: first line over %d bytes", limits.preamble_limit)
            await self._refuse(
                stream,
                None,
                "acp-bridge serve: the first line must be an initialize request of at most "
                f"{limits.preamble_limit} bytes.",
            )
            return
        if preamble is None:
            log.debug("a peer closed the connection before sending anything")
            return
        if self.token is not None:
            first = check_token(preamble.line, self.token)
            if first is None:
                log.warning("refused a connection without a valid token")
                await self._refuse(
                    stream,
                    request_id_of(preamble.line),
                    "acp-bridge serve refused the connection: initialize must carry the "
                    'sidecar\'s token in params._meta["acp-bridge"].token '
                    f"(acp-bridge connect sends {TOKEN_ENV}).",
                )
                return
        else:
            first = strip_token(preamble.line)
        # Unchanged lines are replayed as they came (a "\r\n" included).
        receive = ReplayStream(first + b"\n" + preamble.rest, stream)
        lifecycle = Lifecycle.for_command(self.store, self.options.agent_argv)
        bridge = Bridge(
            self.options, receive, stream, lifecycle, registry=self.registry, spawner=self.spawner
        )
        status = await bridge.run(watch_signals=False)
        log.info("connection closed; agent status %d", status)

    async def _refuse(self, stream: trio.SocketStream, request_id: RequestId, text: str) -> None:
        error = jsonrpc.error_response(request_id, CONNECTION_REFUSED, text)
        # A peer that does not read must not hold the handler.
        with trio.move_on_after(REFUSAL_LINGER):
            await stream.send_all(jsonrpc.encode(error) + b"\n")
            await stream.send_eof()
            # Closing with unread input resets the connection, and a reset can destroy the
            # answer before the peer reads it: read (and drop) what is still coming first.
            drained = 0
            while drained < REFUSAL_DRAIN and (data := await stream.receive_some(65536)):
                drained += len(data)


async def claim_unix_path(path: Path) -> None:
    """Remove a stale socket at ``path``; refuse if a live server still answers on it."""
    if not path.is_socket():
        return  # absent, or a file bind() will refuse to replace
    probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # a stale socket from an earlier run
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"another server is listening on {path}")


async def open_listeners(address: ListenAddress) -> list[trio.SocketListener]:
    if address.scheme == "tcp":
        return await trio.open_tcp_listeners(address.port, host=address.host)
    path = Path(address.path)
    await claim_unix_path(path)
    # Bound under a name of its own and linked into place once it listens: a client that
    # connects as soon as the file exists is never refused between bind() and listen().
    # A link, not a rename, so that whatever else is at the path stays and is refused.
    # (A path too long for a staging name beside it is bound in place, as it is.)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    if len(os.fsencode(staging)) > UNIX_PATH_MAX:
        staging = path
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket file is created 0600
    try:
        await sock.bind(str(staging))
        sock.listen(128)
        if staging != path:
            os.link(staging, path)
    except FileExistsError:
        sock.close()
        raise OSError(errno.EADDRINUSE, f"{path} exists and is not a socket to replace") from None
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
        if staging != path:
            staging.unlink(missing_ok=True)
    return [trio.SocketListener(sock)]


def socket_identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def bound_address(address: ListenAddress, listeners: Sequence[trio.SocketListener]) -> str:
    """Where the server listens: ``address`` with the port the system gave for port 0."""
    if address.scheme != "tcp" or address.port or not listeners:
        return str(address)
    port = listeners[0].socket.getsockname()[1]
    return str(dataclasses.replace(address, port=port))


async def serve(
    server: Server,
    address: ListenAddress,
    *,
    announce: Callable[[str], object] = log.info,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on ``address`` until cancelled or signalled; ``announce`` gets
    the start-up line (``listening on …``) once the socket is bound."""
    drop_token_from_environment()
    listeners = await open_listeners(address)
    ours = socket_identity(Path(address.path)) if address.scheme == "unix" else None
    announce(f"listening on {bound_address(address, listeners)}")
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
        # Only our own socket file: a path someone bound since is theirs.
        if ours is not None and socket_identity(Path(address.path)) == ours:
            Path(address.path).unlink(missing_ok=True)
