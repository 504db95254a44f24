"""Noticing that a peer closed its end of a stream without reading up to the end of file.

A reader learns of an end of file only after reading everything before it. The client pump
stops reading while its writes to an agent block (an agent that is stopped or hung stops
reading): that is how memory stays flat. But then a client that wrote more than the pipes
hold and closed its end would never be seen to leave. The kernel knows at once: a pipe
whose writers are all gone reports ``EPOLLHUP``, a socket whose peer shut down writing
``EPOLLRDHUP``, both with data still unread. :func:`wait_hangup` waits for exactly that,
on an epoll instance of its own that asks for nothing else (edge-triggered), so it costs
nothing while the peer stays and unread data does not wake it.
"""

from __future__ import annotations

import select

import trio


def descriptor_of(stream: object) -> int | None:
    """The file descriptor ``stream`` reads, if it has one: a ``trio.lowlevel.FdStream``,
    a ``trio.SocketStream``, or a wrapper that replays bytes before its ``inner`` stream."""
    while stream is not None:
        if isinstance(stream, trio.lowlevel.FdStream):
            return stream.fileno()
        if isinstance(stream, trio.SocketStream):
            return stream.socket.fileno()
        stream = getattr(stream, "inner", None)
    return None


async def wait_hangup(fd: int) -> bool:
    """Return True once the peer behind ``fd`` has closed its end (or the descriptor
    failed); False at once where this cannot be watched (no epoll, a regular file)."""
    epoll_class = getattr(select, "epoll", None)
    if epoll_class is None:
        return False
    with epoll_class() as epoll:
        try:
            epoll.register(fd, select.EPOLLRDHUP | select.EPOLLET)
        except OSError:
            return False
        # EPOLLHUP and EPOLLERR are reported whether asked for or not.
        await trio.lowlevel.wait_readable(epoll.fileno())
    return True
