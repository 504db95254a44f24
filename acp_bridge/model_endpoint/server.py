"""The endpoint's I/O: a trio + h11 HTTP/1.1 server on 127.0.0.1 and its request log.

This module owns sockets, connection lifetimes and the shared :class:`RequestLog`. What a
request means lives in :mod:`.records`, what to answer in :mod:`.replies`; this layer
only moves bytes between them and the client.

Two ways to run it:

* ``async with open_model_endpoint() as endpoint:`` inside trio code; the server lives
  in a nursery owned by the ``async with`` block.
* ``with ThreadedModelEndpoint() as endpoint:`` from synchronous code; the same server
  runs under ``trio.run`` in a background thread until the block ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Final

import h11
import trio

from acp_bridge.model_endpoint.records import Flavour, Kind, RecordedRequest, parse_request
from acp_bridge.model_endpoint.replies import (
    DEFAULT_REPLY,
    DEFAULT_TITLE,
    Reply,
    error_reply,
    reply_for,
)

logger = logging.getLogger(__name__)

HOST: Final = "127.0.0.1"

# The Anthropic Messages API rejects requests over 32 MB, and no agent sends a larger
# Chat Completions or Responses body in practice (long sessions with images stay well
# below). Anything bigger is refused with 413 instead of being held in memory.
MAX_BODY_SIZE: Final = 32 * 1024 * 1024

# Request line plus headers. Agents send a handful of short headers (a few KiB with
# beta flags and turn metadata); 64 KiB leaves room without letting a client stream
# headers forever.
MAX_HEADER_SIZE: Final = 64 * 1024

RECEIVE_SIZE: Final = 64 * 1024

# After answering with ``Connection: close`` the server half-closes and waits this long
# for the client to close too, so unread client bytes never turn the close into a reset
# that could cut off the end of the stream the client is still reading.
CLOSE_GRACE: Final = 2.0

ReplySource = str | Callable[[RecordedRequest], str]
DelaySource = float | Callable[[RecordedRequest], float]


class RequestLog:
    """Every recorded request, in arrival order, and which ones the client abandoned.

    Changes come only from the server's trio thread. Readers in other threads (the sync
    API) take the lock; trio waiters wake on an event swapped at each change, sync
    waiters on a condition variable.
    """

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._records: list[RecordedRequest] = []
        self._aborted: list[int] = []
        self._seq = 0
        self._trio_changed = trio.Event()

    def next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def add(self, record: RecordedRequest) -> None:
        if self.log_path is not None:
            # One short append per request; a blocking write keeps lines whole and in
            # order without a writer task, and is negligible next to a model call. A lone
            # surrogate (valid JSON, no UTF-8 form) can only stand inside a JSON string,
            # where its backslash escape reads back as the same value.
            with self.log_path.open("a", encoding="utf-8", errors="backslashreplace") as log_file:
                log_file.write(record.to_json_line())
        with self._lock:
            self._records.append(record)
        self._notify()

    def mark_aborted(self, seq: int) -> None:
        with self._lock:
            self._aborted.append(seq)
        self._notify()

    def _notify(self) -> None:
        with self._lock:
            self._changed.notify_all()
        event, self._trio_changed = self._trio_changed, trio.Event()
        event.set()

    def select(
        self, flavour: Flavour | None = None, kind: Kind | None = None
    ) -> list[RecordedRequest]:
        with self._lock:
            return _matching(self._records, flavour, kind)

    def aborted(self) -> list[int]:
        with self._lock:
            return list(self._aborted)

    def clear(self) -> None:
        """Forget what was recorded so far; sequence numbers keep counting."""
        with self._lock:
            self._records.clear()
            self._aborted.clear()

    async def wait_for(
        self, count: int, timeout: float, flavour: Flavour | None = None, kind: Kind | None = None
    ) -> list[RecordedRequest]:
        """Wait (in the server's trio run) until ``count`` matching requests arrived."""
        with trio.move_on_after(timeout):
            while len(found := self.select(flavour, kind)) < count:
                await self._trio_changed.wait()
            return found
        raise self._timeout(f"{count} request(s) (flavour={flavour}, kind={kind})", timeout)

    async def wait_for_aborted(self, count: int, timeout: float) -> list[int]:
        with trio.move_on_after(timeout):
            while len(found := self.aborted()) < count:
                await self._trio_changed.wait()
            return found
        raise self._timeout(f"{count} aborted request(s)", timeout)

    def wait_for_sync(
        self, count: int, timeout: float, flavour: Flavour | None = None, kind: Kind | None = None
    ) -> list[RecordedRequest]:
        """Like :meth:`wait_for`, blocking a thread other than the server's."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(found := _matching(self._records, flavour, kind)) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            else:
                return found
        raise self._timeout(f"{count} request(s) (flavour={flavour}, kind={kind})", timeout)

    def wait_for_aborted_sync(self, count: int, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._aborted) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            else:
                return list(self._aborted)
        raise self._timeout(f"{count} aborted request(s)", timeout)

    def _timeout(self, wanted: str, timeout: float) -> TimeoutError:
        seen = [f"#{r.seq} {r.method} {r.path} [{r.flavour}/{r.kind}]" for r in self.select()]
        return TimeoutError(
            f"model endpoint: waited {timeout}s for {wanted}; "
            f"received {', '.join(seen) or 'nothing'}; aborted {self.aborted() or 'none'}"
        )


def _matching(
    records: list[RecordedRequest], flavour: Flavour | None, kind: Kind | None
) -> list[RecordedRequest]:
    return [
        r
        for r in records
        if (flavour is None or r.flavour == flavour) and (kind is None or r.kind == kind)
    ]


class ModelEndpoint:
    """A fake LLM API server that records what agents send it.

    ``reply`` (text or a function of the request) is what the model says on every main
    call; ``delay`` (seconds or a function of the request) holds each main call: a
    streamed reply after its headers and first event, a plain reply before anything is
    sent. A plain number applies to main calls only, so side calls (titles,
    suggestions) never stall; ``math.inf`` holds a call until the client gives up, which
    is how a test keeps a prompt in flight to cancel it (see :attr:`aborted`). Both may
    be changed while the endpoint runs.
    """

    def __init__(
        self,
        reply: ReplySource = DEFAULT_REPLY,
        delay: DelaySource = 0.0,
        log_path: Path | None = None,
        title: str = DEFAULT_TITLE,
    ) -> None:
        self.reply = reply
        self.delay = delay
        self.title = title
        self.log = RequestLog(log_path)
        self._port: int | None = None
        self._errors: list[BaseException] = []

    # -- where it listens ------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the model endpoint is not listening yet")
        return self._port

    @property
    def url(self) -> str:
        """Base URL without a trailing slash and without ``/v1``: ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    # -- what it received ------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request so far, oldest first."""
        return self.log.select()

    def main_requests(self, flavour: Flavour | None = None) -> list[RecordedRequest]:
        """The agents' own model turns, without side calls and probes."""
        return self.log.select(flavour, "main")

    async def wait_for_requests(
        self,
        count: int = 1,
        timeout: float = 30.0,
        *,
        flavour: Flavour | None = None,
        kind: Kind | None = "main",
    ) -> list[RecordedRequest]:
        """Wait until ``count`` matching requests (main calls by default) were received.

        Returns all matching requests; raises :class:`TimeoutError` naming what did
        arrive. Call it from the trio run that serves the endpoint.
        """
        return await self.log.wait_for(count, timeout, flavour, kind)

    def clear(self) -> None:
        self.log.clear()

    @property
    def aborted(self) -> list[int]:
        """``seq`` of requests whose client disconnected before the reply was complete."""
        return self.log.aborted()

    async def wait_for_aborted(self, count: int = 1, timeout: float = 30.0) -> list[int]:
        """Wait until ``count`` requests were abandoned by their client (e.g. a cancelled
        prompt closing its held model call); returns their ``seq``."""
        return await self.log.wait_for_aborted(count, timeout)

    @property
    def errors(self) -> list[BaseException]:
        """Unexpected failures while serving a connection (a healthy run has none)."""
        return list(self._errors)

    # -- serving ---------------------------------------------------------------------

    async def serve(
        self, port: int = 0, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on 127.0.0.1:``port`` (0 = any free port) and serve until cancelled."""
        listeners = await trio.open_tcp_listeners(port, host=HOST)
        self._port = int(listeners[0].socket.getsockname()[1])
        task_status.started()
        await trio.serve_listeners(self._serve_connection, listeners)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_SIZE)
        try:
            while await self._serve_one(conn, stream):
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away; there is no one left to answer
        except h11.RemoteProtocolError as exc:
            await _send_protocol_error(conn, stream, exc)
        except Exception as exc:
            # One broken exchange must not take the endpoint down under a running agent;
            # keep it for the test to see instead.
            logger.exception("model endpoint: connection failed")
            self._errors.append(exc)
        finally:
            await _close_gracefully(stream)

    async def _serve_one(self, conn: h11.Connection, stream: trio.SocketStream) -> bool:
        """Answer one request; return whether the connection may carry another."""
        event = await _next_event(conn, stream)
        if isinstance(event, h11.ConnectionClosed):
            return False
        if not isinstance(event, h11.Request):
            raise h11.RemoteProtocolError(f"expected a request, got {type(event).__name__}")
        request = event
        declared = _content_length(request)
        if declared is not None and declared > MAX_BODY_SIZE:
            await _send_reply(conn, stream, _too_large(), close=True)
            return False
        if conn.they_are_waiting_for_100_continue:
            await _send(conn, stream, h11.InformationalResponse(status_code=100, headers=[]))
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await _next_event(conn, stream)
            if isinstance(event, h11.EndOfMessage):
                break
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_BODY_SIZE:
                    await _send_reply(conn, stream, _too_large(), close=True)
                    return False
                chunks.append(bytes(event.data))
        record = parse_request(
            seq=self.log.next_seq(),
            method=request.method.decode("ascii", "replace"),
            target=request.target.decode("utf-8", "replace"),
            headers=[(n.decode("latin-1"), v.decode("latin-1")) for n, v in request.headers],
            raw_body=b"".join(chunks),
            timestamp=time.time(),
            limit=MAX_BODY_SIZE,
        )
        self.log.add(record)
        delay = (
            self.delay(record) if callable(self.delay) else (self.delay if record.is_main else 0.0)
        )
        text = self.reply(record) if callable(self.reply) else self.reply
        reply = reply_for(record, text, self.title)
        # A held stream has already sent its headers and first event, like a model that
        # is slow to produce tokens: some agents (goose) only notice a cancel once the
        # response has started. A held plain reply sends nothing until released.
        held_after = 1 if reply.stream else 0
        try:
            await _start_reply(conn, stream, reply, close=reply.stream)
            head = record.method == "HEAD"
            pieces = () if head else reply.chunks
            for chunk in pieces[:held_after]:
                await _send(conn, stream, h11.Data(data=chunk))
            if delay > 0 and not await _hold_unless_disconnected(conn, stream, delay):
                self.log.mark_aborted(record.seq)
                return False
            for chunk in pieces[held_after:]:
                await _send(conn, stream, h11.Data(data=chunk))
            await _send(conn, stream, h11.EndOfMessage())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.log.mark_aborted(record.seq)
            return False
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE


# -- connection helpers (no endpoint state) ----------------------------------------------


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> h11.Event:
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Event):
            return event
        if event is h11.PAUSED:
            # Only reachable if a caller reads the next request before answering this one.
            raise RuntimeError("h11 paused: read ahead of the response")
        # b"" at end of stream is how h11 learns the client closed.
        conn.receive_data(await stream.receive_some(RECEIVE_SIZE))


async def _send(conn: h11.Connection, stream: trio.SocketStream, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)


async def _start_reply(
    conn: h11.Connection, stream: trio.SocketStream, reply: Reply, *, close: bool
) -> None:
    """Send the status line and headers of ``reply``."""
    headers = [
        ("content-type", reply.content_type),
        ("server", "acp-bridge-model-endpoint"),
        *reply.headers,
    ]
    if reply.stream:
        # No length: h11 frames the stream as chunked, and each event goes out as it is
        # produced.
        headers.append(("cache-control", "no-cache"))
    else:
        headers.append(("content-length", str(len(reply.body))))
    if close:
        headers.append(("connection", "close"))
    reason = HTTPStatus(reply.status).phrase.encode("ascii")
    response = h11.Response(status_code=reply.status, headers=headers, reason=reason)
    await _send(conn, stream, response)


async def _send_reply(
    conn: h11.Connection, stream: trio.SocketStream, reply: Reply, *, close: bool
) -> None:
    await _start_reply(conn, stream, reply, close=close)
    for chunk in reply.chunks:
        await _send(conn, stream, h11.Data(data=chunk))
    await _send(conn, stream, h11.EndOfMessage())


async def _hold_unless_disconnected(
    conn: h11.Connection, stream: trio.SocketStream, seconds: float
) -> bool:
    """Sleep ``seconds`` (may be ``inf``); return False early if the client disconnects.

    Agents abort a model call by closing its connection, so watching the socket is how a
    held request learns it was cancelled. Bytes that do arrive meanwhile (a pipelined
    request) go to h11, which keeps them for the next cycle.
    """
    disconnected = False

    async def watch(cancel_scope: trio.CancelScope) -> None:
        nonlocal disconnected
        try:
            while data := await stream.receive_some(RECEIVE_SIZE):
                conn.receive_data(data)
        except trio.BrokenResourceError:
            pass
        disconnected = True
        cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()
    return not disconnected


async def _send_protocol_error(
    conn: h11.Connection, stream: trio.SocketStream, exc: h11.RemoteProtocolError
) -> None:
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return  # a response already started; all that is left is to close
    reply = error_reply(exc.error_status_hint, "invalid_request_error", f"bad HTTP request: {exc}")
    with suppress(h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        await _send_reply(conn, stream, reply, close=True)


async def _close_gracefully(stream: trio.SocketStream) -> None:
    try:
        with trio.move_on_after(CLOSE_GRACE):
            await stream.send_eof()
            while await stream.receive_some(RECEIVE_SIZE):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 rejects a malformed length itself
    return None


def _too_large() -> Reply:
    return error_reply(413, "request_too_large", f"request body over {MAX_BODY_SIZE} bytes")


# -- public entry points -----------------------------------------------------------------


@asynccontextmanager
async def open_model_endpoint(
    reply: ReplySource = DEFAULT_REPLY,
    delay: DelaySource = 0.0,
    log_path: Path | None = None,
    *,
    port: int = 0,
    title: str = DEFAULT_TITLE,
) -> AsyncIterator[ModelEndpoint]:
    """Serve a :class:`ModelEndpoint` for the duration of the ``async with`` block.

    On exit every open connection is cancelled, including held (delayed) calls.
    """
    endpoint = ModelEndpoint(reply=reply, delay=delay, log_path=log_path, title=title)
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve, port)
        try:
            yield endpoint
        finally:
            nursery.cancel_scope.cancel()


class ThreadedModelEndpoint:
    """A :class:`ModelEndpoint` running under its own ``trio.run`` in a background thread.

    For synchronous callers (plain pytest functions, scripts)::

        with ThreadedModelEndpoint(reply="hi") as endpoint:
            run_agent(base_url=endpoint.url)
            endpoint.wait_for_requests(1)
            assert "MARKER" in endpoint.main_requests()[-1].system_text()
    """

    # How long start() waits for the server thread to bind its port.
    START_TIMEOUT: Final = 10.0

    def __init__(
        self,
        reply: ReplySource = DEFAULT_REPLY,
        delay: DelaySource = 0.0,
        log_path: Path | None = None,
        *,
        port: int = 0,
        title: str = DEFAULT_TITLE,
    ) -> None:
        self._options = (reply, delay, log_path, port, title)
        self._endpoint: ModelEndpoint | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._failure: BaseException | None = None

    def start(self) -> ThreadedModelEndpoint:
        if self._thread is not None:
            raise RuntimeError("ThreadedModelEndpoint already started")
        self._thread = threading.Thread(target=self._run, name="model-endpoint", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.START_TIMEOUT):
            raise TimeoutError("model endpoint thread did not start")
        if self._failure is not None:
            raise RuntimeError("model endpoint failed to start") from self._failure
        return self

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._token is not None and self._stop is not None:
            with suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        thread.join()
        if self._failure is not None:
            raise RuntimeError("model endpoint thread failed") from self._failure

    def __enter__(self) -> ThreadedModelEndpoint:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        reply, delay, log_path, port, title = self._options
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with open_model_endpoint(reply, delay, log_path, port=port, title=title) as endpoint:
            self._endpoint = endpoint
            self._ready.set()
            await self._stop.wait()

    # -- the same accessors as ModelEndpoint, safe from the calling thread -----------

    @property
    def endpoint(self) -> ModelEndpoint:
        """The served endpoint; set ``reply``/``delay``/``title`` on it to change answers."""
        if self._endpoint is None:
            raise RuntimeError("the model endpoint is not running")
        return self._endpoint

    @property
    def url(self) -> str:
        return self.endpoint.url

    @property
    def port(self) -> int:
        return self.endpoint.port

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.endpoint.requests

    def main_requests(self, flavour: Flavour | None = None) -> list[RecordedRequest]:
        return self.endpoint.main_requests(flavour)

    def wait_for_requests(
        self,
        count: int = 1,
        timeout: float = 30.0,
        *,
        flavour: Flavour | None = None,
        kind: Kind | None = "main",
    ) -> list[RecordedRequest]:
        """Block until ``count`` matching requests arrived; :class:`TimeoutError` if not."""
        return self.endpoint.log.wait_for_sync(count, timeout, flavour, kind)

    def clear(self) -> None:
        self.endpoint.clear()

    @property
    def aborted(self) -> list[int]:
        return self.endpoint.aborted

    def wait_for_aborted(self, count: int = 1, timeout: float = 30.0) -> list[int]:
        """Block until ``count`` requests were abandoned by their client."""
        return self.endpoint.log.wait_for_aborted_sync(count, timeout)

    @property
    def errors(self) -> list[BaseException]:
        return self.endpoint.errors
