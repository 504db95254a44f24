"""``acp-bridge connect``: the stdio end an editor launches to reach a ``serve`` sidecar.

Editors launch agents as stdio commands; this command is that command for a sidecar. It
copies bytes both ways unchanged, with one exception: when a token is configured (the
``ACP_BRIDGE_TOKEN`` variable or ``--token-file``, never argv) it is added to the editor's
``initialize`` as ``params._meta["acp-bridge"].token``, where ``serve`` checks and removes it.

Until the ``initialize`` is answered the editor must always get an answer to it: a sidecar
that cannot be reached, refuses the connection (its refusal carries the request id, or
``null`` when it could not read one, which is then given the editor's id) or closes without
answering yields a JSON-RPC error with the editor's id. The command exits when either side
closes.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import click
import trio

from acp_bridge import jsonrpc
from acp_bridge.jsonrpc import FrameError, Kind, RequestId
from acp_bridge.serve import (
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

log = logging.getLogger("acp_bridge.connect")

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


async def copy_to_sidecar(
    editor_in: trio.abc.ReceiveStream, sidecar: trio.SocketStream, done: trio.CancelScope
) -> None:
    try:
        while data := await editor_in.receive_some(CHUNK):
            await sidecar.send_all(data)
        await sidecar.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        done.cancel()  # the sidecar is gone; the other direction ends the run
        return
    log.info("the editor closed its end")
    # The sidecar answers by closing once its agent has stopped.
    done.deadline = min(done.deadline, trio.current_time() + DRAIN_TIMEOUT)


async def copy_to_editor(
    sidecar: trio.SocketStream, editor_out: trio.abc.SendStream, watch: Watch
) -> None:
    """Copy the sidecar's bytes; look at whole lines only until initialize is answered."""
    pending = bytearray()  # an incomplete line, while watching
    while True:
        try:
            data = await sidecar.receive_some(CHUNK)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            break
        if watch.answered:
            await editor_out.send_all(data)
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
        if watch.answered:
            out.append(bytes(pending))
            pending.clear()
        if out:
            await editor_out.send_all(b"".join(out))
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
    watch = Watch(initialize_id)
    try:
        await sidecar.send_all(line + b"\n" + first.rest)
        with trio.CancelScope() as done:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(copy_to_sidecar, editor_in, sidecar, done)
                await copy_to_editor(sidecar, editor_out, watch)
                nursery.cancel_scope.cancel()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        log.info("the editor or the sidecar dropped the connection")
    finally:
        with trio.CancelScope(shield=True):
            await sidecar.aclose()
    return 0 if watch.accepted else 1


def check_token_file_mode(path: Path) -> None:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    if mode & 0o077:
        log.warning("the token file %s can be read by other users (mode %o)", path, mode)


def command(address: str, token_file: Path | None, log_level: str) -> None:
    """``acp-bridge connect``: resolve the options, then relay stdio to the sidecar."""
    from acp_bridge.stdio import claim_stdout

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
