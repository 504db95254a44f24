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


@dataclass(frozen=True)
class Line:
    """One complete frame, without its line terminator."""

    data: bytes


@dataclass(frozen=True)
class OverlongLine:
    """A line that exceeded the limit; ``size`` is how many bytes it had in all."""

    size: int


class LineSplitter:
    """Split a byte stream into lines of at most ``limit`` bytes.

    Memory: a line that arrives in one read is sliced out of it (one copy); a line spread
    over reads is gathered in one growing buffer, so it costs its own size however small
    the reads (a slow writer's line arrives a few bytes at a time), plus one copy when it
    is complete: at most about twice its size.
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
        out: list[Line | OverlongLine] = []
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._keep(data, start, len(data))
                return out
            if not self._buffer and not self._discarding:
                out.append(self._whole(data, start, newline))
            else:
                self._keep(data, start, newline)
                out.append(self._finish())
            start = newline + 1

    def close(self) -> list[Line | OverlongLine]:
        """End of stream: a final line without a terminator still counts."""
        if self._discarding or self._buffer:
            return [self._finish()]
        return []

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def _whole(self, data: bytes | bytearray, start: int, end: int) -> Line | OverlongLine:
        """A line that began and ended inside one read."""
        if end > start and data[end - 1] == 0x0D:  # "\r"
            end -= 1
        if end - start > self.limit:
            return OverlongLine(end - start + (1 if data[end] == 0x0D else 0))
        return Line(bytes(data[start:end]))

    def _keep(self, data: bytes | bytearray, start: int, end: int) -> None:
        size = end - start
        if not size:
            return
        if self._discarding:
            self._discarded += size
            return
        # One spare byte: a line of exactly ``limit`` bytes may still end in ``\r\n``.
        if len(self._buffer) + size > self.limit + 1:
            self._discarding = True
            self._discarded = len(self._buffer) + size
            self._buffer = bytearray()  # gives the memory back, unlike clear()
            return
        self._buffer += memoryview(data)[start:end]

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
