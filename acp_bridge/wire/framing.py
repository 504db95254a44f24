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
# A line still arriving after this many bytes may be passed on as it comes
# (core/long_lines.py decides). Below it, gathering a line whole costs little.
DEFAULT_STREAM_AFTER: Final = 128 * 1024
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


@dataclass(frozen=True, slots=True)
class LongLineStart:
    """The first ``stream_after`` bytes (or more) of a line still arriving.

    The reader either passes the line on as it comes (the splitter then yields its further
    bytes as :class:`LongLinePart` and its last ones as :class:`LongLineEnd`) or calls
    :meth:`LineSplitter.hold` to have it gathered whole, as a shorter line is.
    """

    data: bytes


@dataclass(frozen=True, slots=True)
class LongLinePart:
    """More bytes of the line being passed on."""

    data: bytes


@dataclass(frozen=True, slots=True)
class LongLineEnd:
    """The last bytes of the line being passed on, without its terminator (may be empty)."""

    data: bytes


Item = Line | OverlongLine | LongLineStart | LongLinePart | LongLineEnd


class LineSplitter:
    """Split a byte stream into lines of at most ``limit`` bytes.

    Memory: a line that arrives within one read is sliced out of it; a line spread over
    reads is gathered in one growing buffer, so it costs its own size however small the
    reads (a slow writer's line arrives a few bytes at a time), plus one copy when it is
    complete: at most about twice its size.
    """

    def __init__(self, limit: int = DEFAULT_LINE_LIMIT, stream_after: int | None = None) -> None:
        if limit < 1:
            raise ValueError("line limit must be positive")
        self.limit = limit
        # A line that reaches this many bytes before its end is offered as a LongLineStart.
        self.stream_after = stream_after
        self._buffer = bytearray()
        self._discarding = False  # inside an over-long line, waiting for its end
        self._discarded = 0
        self._report_discarded = True  # an over-long line is reported; a failed stream is not
        self._passing = False  # inside a line passed on as it arrives
        self._passed = 0
        self._held_cr = False  # a \r at the end of a passed piece: a terminator, or not
        self._holding = False  # the reader asked for the current line whole

    def feed(self, data: bytes | bytearray) -> list[Item]:
        """Take more bytes; return every line they completed, in order (and, with
        ``stream_after``, the pieces of a long line still arriving)."""
        if self._passing:
            return self._feed_passing(data)
        if self._buffer or self._discarding:
            return self._offer(self._feed_after_partial(data))
        if self._starts_long_line(data):
            # A long line's first read, all of it the line's start: offered as it came, not
            # split, kept and copied out again (three copies of a read, for nothing).
            return [self._start_passing(bytes(data))]
        # Nothing held from an earlier read, the usual case on a busy stream: split the
        # whole read at once (one C call) instead of searching line by line.
        lines = bytes(data).split(b"\n")
        self._keep(lines.pop())  # after the last newline: the start of the next line
        limit = self.limit
        out: list[Item] = []
        for line in lines:
            if line.endswith(b"\r"):
                # The \r is not part of the frame, so a line of ``limit`` bytes may carry it.
                out.append(Line(line[:-1]) if len(line) <= limit + 1 else OverlongLine(len(line)))
            else:
                out.append(Line(line) if len(line) <= limit else OverlongLine(len(line)))
        return self._offer(out)

    def _offer(self, out: list[Item]) -> list[Item]:
        """Add the start of the unfinished line if it has grown long enough to pass on."""
        if (
            self.stream_after is not None
            and not self._holding
            and not self._discarding
            and len(self._buffer) >= self.stream_after
        ):
            data = bytes(self._buffer)
            self._buffer = bytearray()
            out.append(self._start_passing(data))
        return out

    def _start_passing(self, data: bytes) -> LongLineStart:
        """Pass the line on from here: ``data`` is its start."""
        self._passing = True
        self._passed = len(data)
        return LongLineStart(self._hold_back_cr(data))

    def _starts_long_line(self, data: bytes | bytearray) -> bool:
        """Whether ``data``, with nothing held before it (a held line is in the buffer), is
        only the start of a line :meth:`_offer` would offer: at least ``stream_after``
        bytes, within the limit (with its spare byte), no newline."""
        return (
            self.stream_after is not None
            and self.stream_after <= len(data) <= self.limit + 1
            and data.find(b"\n") < 0
        )

    def hold(self, start: bytes) -> None:
        """Gather the line offered by the last :class:`LongLineStart` whole after all."""
        self._passing = False
        self._holding = True
        self._buffer = bytearray(start)
        if self._held_cr:
            self._held_cr = False
            self._buffer += b"\r"

    def discard_rest(self) -> None:
        """Drop the rest of the line being passed on, without reporting it."""
        if self._passing:
            self._passing = False
            self._held_cr = False
            self._discarding = True
            self._discarded = self._passed
            self._report_discarded = False

    def _hold_back_cr(self, data: bytes) -> bytes:
        # A piece ending in \r: it is the terminator if the next piece starts with \n.
        self._held_cr = data.endswith(b"\r")
        return data[:-1] if self._held_cr else data

    def _feed_passing(self, data: bytes | bytearray) -> list[Item]:
        newline = data.find(b"\n")
        piece = bytes(data) if newline < 0 else bytes(data[:newline])
        if self._held_cr:
            piece = b"\r" + piece
            self._held_cr = False
        self._passed += len(piece)
        if self._passed > self.limit + 1:
            # Over the limit: the rest is dropped and the whole reported at its end.
            self._passing = False
            self._discarding = True
            self._discarded = self._passed
            return [] if newline < 0 else self._feed_after_partial(data[newline:])
        if newline < 0:
            return [LongLinePart(self._hold_back_cr(piece))]
        self._passing = False
        if piece.endswith(b"\r"):
            piece = piece[:-1]
        out: list[Item] = [LongLineEnd(piece)]
        return out + self.feed(data[newline + 1 :])

    def feed_short(self, data: bytes | bytearray) -> list[bytes] | None:
        """:meth:`feed` for a read of short lines, the usual read of a busy stream: the
        frames it completes as bare bytes (no :class:`Line` objects, which would cost more
        than some frames take to relay), in order. None, having taken nothing, when the
        read needs :meth:`feed`: a long line is in progress (passed on, held, or dropped
        as over-long), the line held from earlier reads and this read together exceed the
        line limit, or the read completes or begins a line of ``stream_after`` bytes or more.
        """
        if (
            self._passing
            or self._holding
            or self._discarding
            or len(self._buffer) + len(data) > self.limit
        ):
            return None
        # A line of stream_after bytes is feed()'s: unfinished, it is offered to be passed
        # on as it comes; whole, the runtime validates it without building its value.
        long = self.stream_after
        if long is not None and len(self._buffer) + len(data) < long:
            long = None  # no line of this read can be that long
        if long is not None:
            # The first and the unfinished line are measured before splitting, so that a
            # read in the middle of a long line is not split twice.
            first = data.find(b"\n")
            if first < 0 or len(self._buffer) + first >= long:
                return None
            if len(data) - data.rfind(b"\n") - 1 >= long:
                return None
        lines = bytes(data).split(b"\n")
        tail = lines.pop()  # after the last newline: the start of the next line
        if long is not None and max(map(len, lines), default=0) >= long:
            return None
        if lines and self._buffer:
            # The line held from earlier reads ends here.
            self._buffer += lines[0]
            lines[0] = bytes(self._buffer)
            self._buffer = bytearray()
        if tail:
            self._buffer += tail
        if lines and (b"\r" in data or lines[0].endswith(b"\r")):
            # The \r of a \r\n terminator is not part of the frame. (The first line may
            # have its \r at the end of the previous read.)
            lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
        return lines

    def _feed_after_partial(self, data: bytes | bytearray) -> list[Item]:
        out: list[Item] = []
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._keep(data[start:])
                return out
            self._keep(data[start:newline])
            finished = self._finish()
            if finished is not None:
                out.append(finished)
            start = newline + 1
            if not self._buffer and not self._discarding:
                # The held line is complete: the rest goes the fast way.
                return out + self.feed(data[start:])

    def close(self) -> list[Item]:
        """End of stream: a final line without a terminator still counts."""
        if self._passing:
            self._passing = False
            self._held_cr = False  # a final \r is not part of the line (as _finish has it)
            return [LongLineEnd(b"")]
        if self._discarding or self._buffer:
            finished = self._finish()
            return [finished] if finished is not None else []
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

    def _finish(self) -> Line | OverlongLine | None:
        self._holding = False
        if self._discarding:
            size = self._discarded
            self._discarding = False
            self._discarded = 0
            report, self._report_discarded = self._report_discarded, True
            return OverlongLine(size) if report else None
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
