"""Answering a client the bridge cannot serve: its agent cannot start, or its session
database cannot be used.

Every request the client sends gets the same error, naming the cause, so an editor shows
why instead of a bare end of stream; nothing is forwarded anywhere. It ends once the client
has had an answer to its ``initialize`` (a client refused that has nothing more to ask),
when the client's input ends, or after a bounded wait.
"""

from __future__ import annotations

import contextlib
from typing import Final

import trio

from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import Item, Line, LineSplitter
from acp_bridge.wire.jsonrpc import FrameError, JsonObject

# A client that is refused sends a request or two: small reads do.
READ_SIZE: Final = 1 << 16
STREAM_FAILED: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


async def refuse_requests(
    client_in: trio.abc.ReceiveStream,
    client_out: trio.abc.SendStream,
    error: JsonObject,
    *,
    line_limit: int,
    wait: float,
    already_read: bytes = b"",
) -> None:
    """Answer each request of the client with ``error`` (a JSON-RPC error object).

    ``already_read``: bytes of the client's that were read before and not answered yet.
    """
    splitter = LineSplitter(line_limit)
    data: bytes | bytearray = already_read
    with trio.move_on_after(wait), contextlib.suppress(*STREAM_FAILED):
        while True:
            if not data:
                try:
                    data = await client_in.receive_some(READ_SIZE)
                except STREAM_FAILED:
                    data = b""
            items = splitter.feed(data) if data else splitter.close()
            answers, answered_initialize = _answers(items, error)
            if answers:
                await client_out.send_all(b"".join(answers))
            if not data or answered_initialize:
                return
            data = b""


def _answers(items: list[Item], error: JsonObject) -> tuple[list[bytes], bool]:
    """The error answers for the requests among ``items``; whether one was ``initialize``."""
    answers: list[bytes] = []
    initialize = False
    for item in items:
        if not isinstance(item, Line) or not item.data.strip():
            continue
        try:
            frame = jsonrpc.parse(item.data)
        except FrameError:
            continue
        if frame.kind is jsonrpc.Kind.REQUEST:
            answers.append(jsonrpc.encode(jsonrpc.error_answer(frame.id, error)) + b"\n")
            initialize = initialize or frame.method == "initialize"
    return answers, initialize
