"""``acp-bridge connect``: the stdio end an editor launches to reach a ``serve`` sidecar.

Editors launch agents as stdio commands; this command is that command for a sidecar. It
copies bytes both ways unchanged, with one exception: when a token is configured (the
``ACP_BRIDGE_TOKEN`` variable or ``--token-file``, never argv) it is added to the editor's
``initialize`` as ``params._meta["acp-bridge"].token``, where ``serve`` checks and removes it.

Until the ``initialize`` is answered the editor must always get an answer to it: a sidecar
that cannot be reached, refuses the connection (its refusal carries the request id, or
``null`` when it could not read one, which is then given the editor's id) or closes without
answering yields a JSON-RPC error with the editor's id. After that, every request the
editor sent and the sidecar did not answer before it went away (killed, or stopped in the
middle of a turn) gets a ``-32603`` error (:class:`Outstanding` reads the ids off the
lines as they pass). The command exits when either side closes: 0 when the editor closed
its end first and every request was answered, else 1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import click
import trio

from acp_bridge.commands.serve import (
    CONNECTION_REFUSED,
    META_KEY,
    TOKEN_ENV,
    ListenAddress,
    ListenError,
    PreambleTooLong,
    encode_changed,
    parse_initialize,
    read_preamble,
    request_id_of,
)
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import (
    DEFAULT_LINE_LIMIT,
    DEFAULT_STREAM_AFTER,
    Item,
    Line,
    LineSplitter,
    LongLineEnd,
    LongLinePart,
    LongLineStart,
)
from acp_bridge.wire.json_stream import LineValidator
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, FrameError, Kind, RequestId

log = logging.getLogger("acp_bridge.commands.connect")

# The editor's first line is its initialize; the sidecar accepts far less than this.
FIRST_LINE_LIMIT: Final = 1 << 20
# Lines from the sidecar are watched (not just copied) only until initialize is answered.
WATCH_LIMIT: Final = 64 * 1024 * 1024
CONNECT_TIMEOUT: Final = 10.0
# After the editor closes its end the sidecar stops the agent; its last frames may still
# be on the way, so wait this long for the sidecar to close before leaving.
DRAIN_TIMEOUT: Final = 10.0
CHUNK: Final = 65536


class TokenError(ValueError):
    pass


def read_token_file(path: Path) -> str:
    """The token in ``path``, without surrounding whitespace (a trailing newline is usual)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenError(f"cannot read the token file {path}: {exc}") from exc
    token = text.strip()
    if not token:
        raise TokenError(f"the token file {path} is empty")
    if "\n" in token:
        raise TokenError(f"the token file {path} holds more than one line")
    return token


def resolve_token(token_file: Path | None) -> str | None:
    if token_file is not None:
        return read_token_file(token_file)
    return os.environ.get(TOKEN_ENV) or None


def with_token(line: bytes, token: str) -> bytes:
    """The editor's initialize with the token added; any other line as it is."""
    message = parse_initialize(line)
    if message is None:
        return line  # the sidecar answers what it cannot use
    params = dict(message["params"])
    meta = params.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    bridge_meta = meta.get(META_KEY)
    bridge_meta = dict(bridge_meta) if isinstance(bridge_meta, dict) else {}
    bridge_meta["token"] = token
    meta[META_KEY] = bridge_meta
    params["_meta"] = meta
    return encode_changed({**message, "params": params})


def error_line(request_id: RequestId, text: str) -> bytes:
    return jsonrpc.encode(jsonrpc.error_response(request_id, CONNECTION_REFUSED, text)) + b"\n"


async def open_sidecar(address: ListenAddress) -> trio.SocketStream:
    with trio.fail_after(CONNECT_TIMEOUT):
        if address.scheme == "unix":
            return await trio.open_unix_socket(address.path)
        return await trio.open_tcp_stream(address.host, address.port)


def connect_failure(exc: BaseException) -> str:
    """Why connecting failed, in the words of the system call (not only "all attempts")."""
    if isinstance(exc, trio.TooSlowError):
        return f"no answer within {CONNECT_TIMEOUT:g}s"
    attempts = getattr(exc.__cause__, "exceptions", ())
    reasons = [str(a.strerror or a) for a in attempts if isinstance(a, OSError)]
    return "; ".join(dict.fromkeys(reasons)) or str(exc)


@dataclass
class Watch:
    """The sidecar's side until the editor's initialize is answered."""

    initialize_id: RequestId
    answered: bool = False
    accepted: bool = False  # answered with a result, not an error

    def look_at(self, line: bytes) -> bytes:
        """The line to pass on; an unaddressed error before the answer becomes the answer."""
        try:
            frame = jsonrpc.parse(line)
        except FrameError:
            return line
        message = frame.message
        if frame.kind is not Kind.RESPONSE:
            return line
        if message.get("id") == self.initialize_id and type(message.get("id")) is type(
            self.initialize_id
        ):
            self.answered = True
            self.accepted = "result" in message
            return line
        if message.get("id") is None and isinstance(message.get("error"), dict):
            # Only the initialize has been sent, so an error without an id is about it.
            self.answered = True
            return encode_changed({**message, "id": self.initialize_id})
        return line


class LineIds:
    """The requests and responses among the lines of one direction, by id, read as the
    bytes pass (sans-IO). A short line is parsed only if it can hold an id; a long one is
    judged piece by piece (``json_stream``) without being gathered."""

    KINDS: Final = (Kind.REQUEST, Kind.RESPONSE)

    def __init__(self) -> None:
        self._splitter = LineSplitter(DEFAULT_LINE_LIMIT, stream_after=DEFAULT_STREAM_AFTER)
        self._long: LineValidator | None = None  # the long line in progress, while valid
        self._mid_line = False  # the bytes so far end inside a line

    def feed(self, data: bytes | bytearray) -> list[tuple[Kind, RequestId]]:
        data = bytes(data)
        mid_line, self._mid_line = self._mid_line, not data.endswith(b"\n")
        last = data.rfind(b"\n")
        if last < 0 or self._may_hold_id(data):
            return self._feed(data)
        # The whole lines in between hold no id (most of a stream: notifications): only
        # the end of the line in progress and the start of the next one are read.
        found = self._feed(data[: data.find(b"\n") + 1]) if mid_line else []
        return found + self._feed(data[last + 1 :])

    @staticmethod
    def _may_hold_id(data: bytes) -> bool:
        # A key "id" is written "id", or (rarely) with a \u escape.
        return b'"id"' in data or b"\\u" in data

    def _feed(self, data: bytes) -> list[tuple[Kind, RequestId]]:
        found: list[tuple[Kind, RequestId]] = []
        for item in self._splitter.feed(data):
            found.extend(self._read(item))
        return found

    def _read(self, item: Item) -> list[tuple[Kind, RequestId]]:
        if isinstance(item, Line):
            if not self._may_hold_id(item.data):
                return []
            try:
                frame = jsonrpc.parse(item.data)
            except FrameError:
                return []
            if frame.kind is not Kind.BATCH:
                return [(frame.kind, frame.id)] if frame.kind in self.KINDS else []
            found: list[tuple[Kind, RequestId]] = []
            for member in frame.message:
                try:
                    each = jsonrpc.classify_message(member, b"")  # b"": no bytes made
                except FrameError:
                    continue  # the sidecar answers a malformed member under its own id
                if each.kind in self.KINDS:
                    found.append((each.kind, each.id))
            return found
        if isinstance(item, LongLineStart):
            self._long = LineValidator()
        if self._long is not None and isinstance(item, LongLineStart | LongLinePart | LongLineEnd):
            try:
                self._long.feed(item.data)
                if isinstance(item, LongLineEnd):
                    envelope = self._long.finish()
                    self._long = None
                    kind = envelope.kind()
                    if kind in self.KINDS:
                        return [(kind, envelope.members.get("id"))]
            except FrameError:
                self._long = None
        return []


def id_key(request_id: RequestId) -> tuple[bool, RequestId]:
    """``1`` and ``"1"`` are different ids."""
    return (isinstance(request_id, str), request_id)


class Outstanding:
    """The editor's requests the sidecar has not answered yet (sans-IO): fed the bytes
    each way after the initialize, it keeps only the ids of requests in flight."""

    def __init__(self) -> None:
        self._requests = LineIds()
        self._responses = LineIds()
        self._pending: dict[tuple[bool, RequestId], RequestId] = {}

    def from_editor(self, data: bytes | bytearray) -> None:
        for kind, request_id in self._requests.feed(data):
            if kind is Kind.REQUEST and request_id is not None:
                self._pending[id_key(request_id)] = request_id

    def from_sidecar(self, data: bytes | bytearray) -> None:
        for kind, request_id in self._responses.feed(data):
            if kind is Kind.RESPONSE:
                self._pending.pop(id_key(request_id), None)

    def unanswered(self) -> list[RequestId]:
        """The ids still waiting, in the order they were sent."""
        return list(self._pending.values())


@dataclass
class Connection:
    """What one editor connection has seen, for how it ends."""

    watch: Watch
    outstanding: Outstanding
    editor_closed: bool = False
    mid_line: bool = False
    """The editor's last bytes from the sidecar end inside a line."""

    async def to_editor(self, editor_out: trio.abc.SendStream, data: bytes) -> None:
        if self.watch.answered:
            self.outstanding.from_sidecar(data)
        await editor_out.send_all(data)
        self.mid_line = not data.endswith(b"\n")


async def copy_to_sidecar(
    editor_in: trio.abc.ReceiveStream,
    sidecar: trio.SocketStream,
    done: trio.CancelScope,
    connection: Connection,
) -> None:
    try:
        while data := await editor_in.receive_some(CHUNK):
            connection.outstanding.from_editor(data)
            await sidecar.send_all(data)
        connection.editor_closed = True
        await sidecar.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        done.cancel()  # the sidecar is gone; the other direction ends the run
        return
    log.info("the editor closed its end")
    # The sidecar answers by closing once its agent has stopped.
    done.deadline = min(done.deadline, trio.current_time() + DRAIN_TIMEOUT)


async def copy_to_editor(
    sidecar: trio.SocketStream, editor_out: trio.abc.SendStream, connection: Connection
) -> None:
    """Copy the sidecar's bytes; look at whole lines only until initialize is answered."""
    watch = connection.watch
    pending = bytearray()  # an incomplete line, while watching
    while True:
        try:
            data = await sidecar.receive_some(CHUNK)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            break
        if watch.answered:
            await connection.to_editor(editor_out, bytes(data))
            continue
        searched = len(pending)  # the bytes held so far have no newline
        pending += data
        out: list[bytes] = []
        while not watch.answered and (newline := pending.find(b"\n", searched)) >= 0:
            line = bytes(pending[:newline])
            del pending[: newline + 1]
            searched = 0
            terminator = b"\r\n" if line.endswith(b"\r") else b"\n"
            out.append(watch.look_at(line.removesuffix(b"\r")) + terminator)
        if not watch.answered and len(pending) > WATCH_LIMIT:
            # A frame this large is no refusal: stop looking and just copy.
            log.warning("the sidecar sent a line over %d bytes before initialize", WATCH_LIMIT)
            watch.answered = watch.accepted = True
        rest = b""
        if watch.answered:
            rest = bytes(pending)
            pending.clear()
        if out:
            await editor_out.send_all(b"".join(out))
        if rest:
            await connection.to_editor(editor_out, rest)
    if not watch.answered:
        # An unfinished line is not a frame; the editor gets only the answer.
        log.warning("the sidecar closed the connection before answering initialize")
        await editor_out.send_all(
            error_line(
                watch.initialize_id,
                "acp-bridge connect: the sidecar closed the connection before answering "
                "initialize; its log says why.",
            )
        )


async def run_connect(
    address: ListenAddress,
    token: str | None,
    editor_in: trio.abc.ReceiveStream,
    editor_out: trio.abc.SendStream,
) -> int:
    """Relay one editor connection; 0 when the initialize was accepted, else 1."""
    try:
        first = await read_preamble(editor_in, FIRST_LINE_LIMIT)
    except PreambleTooLong:
        await editor_out.send_all(
            error_line(None, "acp-bridge connect: the first line must be an initialize request.")
        )
        return 1
    if first is None:
        return 0  # the editor left before saying anything
    initialize_id = request_id_of(first.line)
    try:
        sidecar = await open_sidecar(address)
    except (OSError, trio.TooSlowError) as exc:
        cause = connect_failure(exc)
        log.error("cannot reach the sidecar at %s: %s", address, cause)
        await editor_out.send_all(
            error_line(
                initialize_id,
                f"acp-bridge connect: cannot reach the sidecar at {address}: {cause}",
            )
        )
        return 1
    line = with_token(first.line, token) if token is not None else first.line
    connection = Connection(Watch(initialize_id), Outstanding())
    connection.outstanding.from_editor(first.rest)
    try:
        await sidecar.send_all(line + b"\n" + first.rest)
        with trio.CancelScope() as done:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(copy_to_sidecar, editor_in, sidecar, done, connection)
                await copy_to_editor(sidecar, editor_out, connection)
                nursery.cancel_scope.cancel()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        log.info("the editor or the sidecar dropped the connection")
    finally:
        with trio.CancelScope(shield=True):
            await sidecar.aclose()
    if not connection.watch.accepted:
        return 1
    unanswered = connection.outstanding.unanswered()
    if not connection.editor_closed:
        log.error("the sidecar closed the connection; %d requests unanswered", len(unanswered))
    if unanswered:
        await answer_unanswered(editor_out, connection, unanswered)
    return 0 if connection.editor_closed and not unanswered else 1


async def answer_unanswered(
    editor_out: trio.abc.SendStream, connection: Connection, unanswered: list[RequestId]
) -> None:
    """The sidecar went away: each request it did not answer gets an error."""
    text = (
        "acp-bridge connect: the sidecar closed the connection before answering this "
        "request; its log says why."
    )
    errors = [
        jsonrpc.encode(jsonrpc.error_response(request_id, INTERNAL_ERROR, text)) + b"\n"
        for request_id in unanswered
    ]
    # A line the sidecar left unfinished is ended first, so each error is a line of its own.
    start = b"\n" if connection.mid_line else b""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await editor_out.send_all(start + b"".join(errors))


def check_token_file_mode(path: Path) -> None:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    if mode & 0o077:
        log.warning("the token file %s can be read by other users (mode %o)", path, mode)


def command(address: str, token_file: Path | None, log_level: str) -> None:
    """``acp-bridge connect``: resolve the options, then relay stdio to the sidecar."""
    from acp_bridge.runtime.stdio import claim_stdout

    acp_fd = claim_stdout()
    logging.basicConfig(
        stream=sys.stderr,
        level=log_level.upper(),
        format="acp-bridge connect: %(levelname)s %(message)s",
    )
    try:
        parsed = ListenAddress.parse(address)
    except ListenError as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from exc
    try:
        token = resolve_token(token_file)
    except TokenError as exc:
        raise click.BadParameter(str(exc), param_hint="--token-file") from exc
    if token_file is not None:
        check_token_file_mode(token_file)

    async def main() -> int:
        editor_in = trio.lowlevel.FdStream(os.dup(0))
        editor_out = trio.lowlevel.FdStream(acp_fd)
        try:
            return await run_connect(parsed, token, editor_in, editor_out)
        finally:
            await editor_in.aclose()
            await editor_out.aclose()

    try:
        status = trio.run(main)
    except KeyboardInterrupt:
        status = 130
    sys.exit(status)
