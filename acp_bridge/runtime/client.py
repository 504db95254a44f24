"""A small ACP client over trio streams, used by ``check``, ``verify`` and the tests.

It plays the editor: sends requests, collects ``session/update`` notifications, and answers
the agent's own requests the way a cautious editor would (permission requests get the
first "allow" option; file reads are served from disk; anything else is ``-32601``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import Line, LineSplitter
from acp_bridge.wire.jsonrpc import JsonObject, Kind, RequestId

log = logging.getLogger("acp_bridge.runtime.client")


class ClientRequestError(Exception):
    """The peer answered a request with an error."""

    def __init__(self, method: str, error: JsonObject) -> None:
        super().__init__(f"{method}: {error.get('code')} {error.get('message')}")
        self.method = method
        self.error = error

    @property
    def code(self) -> Any:
        return self.error.get("code")


class ConnectionLost(Exception):
    """The peer closed the connection before answering."""


@dataclass
class AcpClient:
    """JSON-RPC over a byte stream pair; run :meth:`serve` in a nursery (see :func:`connect`)."""

    send_stream: trio.abc.SendStream
    receive_stream: trio.abc.ReceiveStream
    notifications: list[JsonObject] = field(default_factory=list)
    agent_requests: list[JsonObject] = field(default_factory=list)
    _pending: dict[RequestId, trio.MemorySendChannel[JsonObject | None]] = field(
        default_factory=dict
    )
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: trio.Lock = field(default_factory=trio.Lock)
    closed: bool = False

    async def send_message(self, message: Any) -> None:
        async with self._lock:
            await self.send_stream.send_all(jsonrpc.encode(message) + b"\n")

    async def request(self, method: str, params: Any) -> Any:
        """Send a request; return its result or raise :class:`ClientRequestError`."""
        response = await self.request_raw(method, params)
        if "error" in response:
            raise ClientRequestError(method, response["error"])
        return response.get("result")

    async def request_raw(self, method: str, params: Any) -> JsonObject:
        """Send a request; return the whole response object."""
        request_id = next(self._ids)
        send, receive = trio.open_memory_channel[JsonObject | None](1)
        self._pending[request_id] = send
        await self.send_message(jsonrpc.request(request_id, method, params))
        response = await receive.receive()
        if response is None:
            raise ConnectionLost(f"connection closed before {method} was answered")
        return response

    async def notify(self, method: str, params: Any) -> None:
        await self.send_message(jsonrpc.notification(method, params))

    def updates(self, session_id: str) -> list[JsonObject]:
        return [
            n["params"]["update"]
            for n in self.notifications
            if n.get("method") == "session/update"
            and isinstance(n.get("params"), dict)
            and n["params"].get("sessionId") == session_id
        ]

    def agent_text(self, session_id: str) -> str:
        return "".join(
            u.get("content", {}).get("text", "")
            for u in self.updates(session_id)
            if u.get("sessionUpdate") == "agent_message_chunk"
        )

    async def serve(self) -> None:
        """Read frames until the peer closes; dispatch responses, answer requests."""
        splitter = LineSplitter()
        try:
            while True:
                try:
                    data = await self.receive_stream.receive_some(1 << 20)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                for item in splitter.feed(data) if data else splitter.close():
                    if isinstance(item, Line) and item.data.strip():
                        await self._dispatch(item.data)
                if not data:
                    return
        finally:
            self.closed = True
            for waiter in self._pending.values():
                waiter.send_nowait(None)
            self._pending.clear()

    async def _dispatch(self, raw: bytes) -> None:
        try:
            frame = jsonrpc.parse(raw)
        except jsonrpc.FrameError as exc:
            log.warning("client got a bad frame: %s", exc)
            return
        if frame.kind is Kind.RESPONSE:
            waiter = self._pending.pop(frame.id, None)
            if waiter is not None:
                waiter.send_nowait(frame.message)
        elif frame.kind is Kind.NOTIFICATION:
            self.notifications.append(frame.message)
        elif frame.kind is Kind.REQUEST:
            self.agent_requests.append(frame.message)
            await self.send_message(self._answer(frame.message))

    def _answer(self, message: JsonObject) -> JsonObject:
        method = message.get("method")
        params = message.get("params") or {}
        request_id = message.get("id")
        if method == "session/request_permission":
            options = params.get("options") or []
            allow = next((o for o in options if str(o.get("kind", "")).startswith("allow")), None)
            outcome: JsonObject = (
                {"outcome": "selected", "optionId": allow["optionId"]}
                if allow
                else {"outcome": "cancelled"}
            )
            return jsonrpc.result_response(request_id, {"outcome": outcome})
        if method == "fs/read_text_file":
            try:
                content = Path(params["path"]).read_text()
            except (OSError, KeyError) as exc:
                return jsonrpc.error_response(request_id, jsonrpc.INTERNAL_ERROR, str(exc))
            return jsonrpc.result_response(request_id, {"content": content})
        return jsonrpc.error_response(request_id, jsonrpc.METHOD_NOT_FOUND, "Method not found")


@asynccontextmanager
async def connect(
    send_stream: trio.abc.SendStream, receive_stream: trio.abc.ReceiveStream
) -> AsyncIterator[AcpClient]:
    """An :class:`AcpClient` serving in the background for the duration of the block."""
    client = AcpClient(send_stream, receive_stream)
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.serve)
        try:
            yield client
        except Exception as exc:  # re-raised below as itself, not inside an ExceptionGroup
            failure = exc
        finally:
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


class Started(Protocol):
    """A started process with pipes to its stdin and stdout (``trio.Process`` is one)."""

    @property
    def stdin(self) -> trio.abc.SendStream | None: ...
    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...
    def kill(self) -> None: ...


@asynccontextmanager
async def client_of(process: Started) -> AsyncIterator[AcpClient]:
    """A client on a started process's pipes. On the way out the process's stdin is closed
    and it is waited for, and killed if it has not exited within 10 s."""
    assert process.stdin is not None and process.stdout is not None
    try:
        async with connect(process.stdin, process.stdout) as client:
            yield client
    finally:
        with trio.CancelScope(shield=True):
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await process.stdin.aclose()
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


@asynccontextmanager
async def spawn_bridge(
    argv: Sequence[str], env: dict[str, str] | None = None
) -> AsyncIterator[tuple[AcpClient, trio.Process]]:
    """Start a bridge (or any ACP agent) as a subprocess and connect a client to it."""
    import subprocess

    process = await trio.lowlevel.open_process(
        list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    async with client_of(process) as client:
        yield client, process
