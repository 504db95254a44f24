"""Relays that judge every line as the bridge does, each moving the bytes another way.

    python bench/judging_relay.py MODE AGENT_CMD [ARGS...]

What a long line could cost a relay that must judge it (``json_stream.LineValidator``,
fed each piece as it arrives, each line finished at its newline) but does nothing else: no
router, no outbox, no splitter. ``bench/large_frames.py`` runs them beside the bridge and
the raw relay to tell what a faster way of moving the bytes would win. Modes:

* ``trio``: trio reads of 128 KiB (the bridge's read size), judged, written;
* ``thread``: one worker thread per direction (``trio.to_thread``) with blocking reads
  and writes, judged in the thread, the event loop idle meanwhile;
* ``splice``: ``tee(2)`` of what waits in the input pipe into a side pipe, the copy read
  and judged, then ``splice(2)`` of those bytes from the input pipe to the output pipe,
  so the relay's own copy is only read, never written (Linux; libc's ``tee`` through
  ctypes);
* ``splice-unjudged``: ``splice(2)`` alone, judging nothing: the floor of moving bytes
  inside the kernel.

The judging modes take pieces of at most 128 KiB, as the bridge does: a larger piece costs
the validator more where a line starts (it decodes such a piece whole).

A line that is not valid JSON ends the relay with an error: these are measuring tools, the
bench only sends valid lines.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import select
import subprocess
import sys
from typing import Final

import trio
from trio.lowlevel import FdStream, wait_readable, wait_writable

from acp_bridge.wire.json_stream import LineValidator

READ_CHUNK: Final = 128 * 1024  # the bridge's (pumps.READ_CHUNK)
PIPE_SIZE: Final = 1 << 20  # what the bridge widens its pipes to
NONBLOCK: Final = 2  # SPLICE_F_NONBLOCK


def widen(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)


class Judge:
    """Lines judged piece by piece, as they arrive."""

    def __init__(self) -> None:
        self.validator = LineValidator()

    def feed(self, data: bytes) -> None:
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            if newline > start:
                self.validator.feed(data[start:newline])
            self.validator.finish()
            self.validator = LineValidator()
            start = newline + 1
        if start < len(data):
            self.validator.feed(data[start:] if start else data)


async def copy_trio(source: int, sink: int) -> None:
    judge = Judge()
    reader, writer = FdStream(source), FdStream(sink)
    while data := await reader.receive_some(READ_CHUNK):
        judge.feed(data)
        await writer.send_all(data)
    await writer.aclose()


def copy_blocking(source: int, sink: int) -> None:
    judge = Judge()
    readable, writable = select.poll(), select.poll()
    readable.register(source, select.POLLIN)
    writable.register(sink, select.POLLOUT)
    while True:
        try:
            data = os.read(source, READ_CHUNK)
        except BlockingIOError:
            readable.poll()
            continue
        if not data:
            break
        judge.feed(data)
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(sink, view) :]
            except BlockingIOError:
                writable.poll()
    os.close(sink)


async def copy_thread(source: int, sink: int) -> None:
    await trio.to_thread.run_sync(copy_blocking, source, sink)


def load_tee() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    tee = ctypes.CDLL(None, use_errno=True).tee
    tee.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
    tee.restype = ctypes.c_ssize_t
    return tee


async def splice_all(source: int, sink: int, count: int) -> None:
    while count:
        try:
            moved = os.splice(source, sink, count, flags=NONBLOCK)
        except BlockingIOError:  # the output pipe is full: the input has the bytes
            await wait_writable(sink)
            continue
        if not moved:
            raise RuntimeError("the input pipe lost bytes it had")
        count -= moved


async def copy_splice(source: int, sink: int) -> None:
    tee = load_tee()
    judge = Judge()
    side_read, side_write = os.pipe2(os.O_NONBLOCK)
    widen(side_write)
    while True:
        count = tee(source, side_write, READ_CHUNK, NONBLOCK)
        if count < 0:
            if ctypes.get_errno() != errno.EAGAIN:
                raise OSError(ctypes.get_errno(), "tee")
            await wait_readable(source)
            continue
        if count == 0:
            break  # the end of the input
        judge.feed(os.read(side_read, count))
        await splice_all(source, sink, count)
    os.close(sink)


async def copy_unjudged(source: int, sink: int) -> None:
    while True:
        try:
            moved = os.splice(source, sink, PIPE_SIZE, flags=NONBLOCK)
        except BlockingIOError:
            _, ready, _ = select.select([], [sink], [], 0)
            if ready:
                await wait_readable(source)
            else:
                await wait_writable(sink)
            continue
        if not moved:
            break
    os.close(sink)


COPIES: Final = {
    "trio": copy_trio,
    "thread": copy_thread,
    "splice": copy_splice,
    "splice-unjudged": copy_unjudged,
}


async def relay(mode: str, argv: list[str]) -> int:
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    to_agent, from_agent = os.dup(process.stdin.fileno()), os.dup(process.stdout.fileno())
    process.stdin.close()
    process.stdout.close()
    from_client, to_client = os.dup(0), os.dup(1)
    for fd in (from_client, to_client, to_agent, from_agent):
        widen(fd)
        os.set_blocking(fd, False)
    copy = COPIES[mode]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copy, from_client, to_agent)
        nursery.start_soon(copy, from_agent, to_client)
    return process.wait()


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in COPIES:
        sys.exit(__doc__)
    sys.exit(trio.run(relay, sys.argv[1], sys.argv[2:]))


if __name__ == "__main__":
    main()
