"""A peer that closed its end is noticed with its data still unread (acp_bridge.runtime.hangup)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import trio
import trio.testing

from acp_bridge.runtime.hangup import descriptor_of, wait_hangup


async def hung_up_after(fd: int, close_peer: Callable[[], None]) -> bool:
    """Whether :func:`wait_hangup` was still waiting with data unread and the peer there,
    and returned once ``close_peer()`` ran."""
    result: list[bool] = []

    async def watch() -> None:
        result.append(await wait_hangup(fd))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.testing.wait_all_tasks_blocked()
            waiting = not result
            close_peer()
    return waiting and result == [True]


async def test_a_pipe_whose_writer_closed_is_noticed_with_data_unread() -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b'{"jsonrpc":"2.0","method":"x"}\n' * 100)
        assert await hung_up_after(read_end, lambda: os.close(write_end))
        assert os.read(read_end, 1 << 16)  # the data is still there to read
    finally:
        os.close(read_end)


async def test_a_socket_whose_peer_shut_down_writing_is_noticed_with_data_unread() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"unread\n")
        assert await hung_up_after(ours.fileno(), lambda: theirs.shutdown(socket.SHUT_WR))


async def test_a_regular_file_cannot_be_watched() -> None:
    with open(__file__, "rb") as file:
        assert await wait_hangup(file.fileno()) is False


async def test_the_descriptor_is_found_through_replaying_wrappers() -> None:
    class Replaying(trio.abc.ReceiveStream):
        def __init__(self, inner: trio.abc.ReceiveStream) -> None:
            self.inner = inner

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            return b""

        async def aclose(self) -> None:
            pass

    read_end, write_end = os.pipe()
    stream = trio.lowlevel.FdStream(read_end)
    try:
        assert descriptor_of(Replaying(Replaying(stream))) == read_end
        left, _ = trio.testing.memory_stream_pair()
        assert descriptor_of(Replaying(left)) is None
    finally:
        os.close(write_end)
        await stream.aclose()  # it owns read_end
