"""Newline-delimited framing, sans-IO: bytes in, complete lines out, with a size limit;
frames out, as few newline-terminated buffers as possible.

ACP v1 stdio carries one JSON-RPC message per ``\\n``-terminated line. Peers may send
``\\r\\n``; the ``\\r`` is not part of the frame. A line longer than the limit is not
buffered whole: the splitter drops its bytes as they arrive and reports it once, so a
hostile peer cannot make the bridge hold more than ``limit`` bytes of one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

# Base64 images and embedded files make real ACP lines large; 64 MiB holds any frame
# an editor sends in practice while keeping a hard bound on memory per connection.
DEFAULT_LINE_LIMIT: Final = 64 * 1024 * 1024
# A frame this large is written from its own buffer instead of being copied into a joined
# one: the copy would cost more than the extra write. A pipe holds 64 KiB on Linux, so a
# frame this large takes several writes anyway.
JOIN_LIMIT: Final = 64 * 1024


@dataclass(slots=True)
class Line:
    """One complete frame, without its line terminator. (Treat as immutable; not frozen
    because one is made per frame relayed.)"""

    data: bytes


@dataclass(frozen=True)
class OverlongLine:
    """A line that exceeded the limit; ``size`` is how many bytes it had in all."""

    size: int


class LineSplitter:
    """Split a byte stream into lines of at most ``limit`` bytes.

    Memory: a line that arrives within one read is sliced out of it; a line spread over
    reads is gathered in one growing buffer, so it costs its own size however small the
    reads (a slow writer's line arrives a few bytes at a time), plus one copy when it is
    complete: at most about twice its size.
    """

    def __init__(self, limit: int = DEFAULT_LINE_LIMIT) -> None:
        if limit < 1:
            raise ValueError("line limit must be positive")
        self.limit = limit
        self._buffer = bytearray()
        self._discarding = False  # inside an over-long line, waiting for its end
        self._discarded = 0

    def feed(self, data: bytes | bytearray) -> list[Line | OverlongLine]:
        """Take more bytes; return every line they completed, in order."""
        if self._buffer or self._discarding:
            return self._feed_after_partial(data)
        # Nothing held from an earlier read, the usual case on a busy stream: split the
        # whole read at once (one C call) instead of searching line by line.
        lines = bytes(data).split(b"\n")
        self._keep(lines.pop())  # after the last newline: the start of the next line
        limit = self.limit
        out: list[Line | OverlongLine] = []
        for line in lines:
            if line.endswith(b"\r"):
                # The \r is not part of the frame, so a line of ``limit`` bytes may carry it.
                out.append(Line(line[:-1]) if len(line) <= limit + 1 else OverlongLine(len(line)))
            else:
                out.append(Line(line) if len(line) <= limit else OverlongLine(len(line)))
        return out

    def _feed_after_partial(self, data: bytes | bytearray) -> list[Line | OverlongLine]:
        out: list[Line | OverlongLine] = []
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._keep(data[start:])
                return out
            self._keep(data[start:newline])
            out.append(self._finish())
            start = newline + 1
            if not self._buffer and not self._discarding:
                # The held line is complete: the rest goes the fast way.
                return out + self.feed(data[start:])

    def close(self) -> list[Line | OverlongLine]:
        """End of stream: a final line without a terminator still counts."""
        if self._discarding or self._buffer:
            return [self._finish()]
        return []

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def _keep(self, piece: bytes | bytearray) -> None:
        if not piece:
            return
        if self._discarding:
            self._discarded += len(piece)
            return
        # One spare byte: a line of exactly ``limit`` bytes may still end in ``\r\n``.
        if len(self._buffer) + len(piece) > self.limit + 1:
            self._discarding = True
            self._discarded = len(self._buffer) + len(piece)
            self._buffer = bytearray()  # gives the memory back, unlike clear()
            return
        # One buffer, not a list of reads: each read would cost a Python object of its own.
        self._buffer += piece

    def _finish(self) -> Line | OverlongLine:
        if self._discarding:
            size = self._discarded
            self._discarding = False
            self._discarded = 0
            return OverlongLine(size)
        buffer, self._buffer = self._buffer, bytearray()
        if buffer.endswith(b"\r"):
            del buffer[-1]  # in place: no copy of the whole line
        elif len(buffer) > self.limit:
            return OverlongLine(len(buffer))
        return Line(bytes(buffer))


def join_lines(frames: Iterable[bytes]) -> Iterator[bytes]:
    """The frames as newline-terminated lines, in order, in as few buffers as possible.

    Small frames are joined into one buffer; a frame of ``JOIN_LIMIT`` bytes or more is
    yielded as it is (its newline starts the next buffer), so it is never copied.
    """
    pending: list[bytes] = []
    for frame in frames:
        if len(frame) >= JOIN_LIMIT:
            if pending:
                yield b"".join(pending)
            yield frame
            pending = []
        else:
            pending.append(frame)
        pending.append(b"\n")
    if pending:
        yield b"".join(pending)
