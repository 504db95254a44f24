"""Reading and writing a peer's pipe without a trip to the scheduler when it is ready.

trio's ``FdStream`` passes a checkpoint (a schedule point: the task is put at the back of
the run queue and the event loop goes round once) before every ``receive_some`` and
``send_all``, and only then reads or writes. A relay between two peers that answer at once
mostly finds its pipes empty when it reads (it then waits for them anyway) and free when it
writes, so those checkpoints are most of its trips through the scheduler: relaying one
intercepted request and its answer took eight task steps, four of them these.

* :func:`receive_some` reads first. Only when the pipe is empty does it wait (that wait is
  the schedule point); when there were bytes to read, it still yields to the scheduler
  after the read, so a peer that writes without pause cannot keep the other tasks from
  running. A cancelled read raises before it reads, as trio's does: no bytes are lost.
* :func:`receive_ready` is that first read alone, with its schedule points (:func:`read_now`
  is the read without them), for a reader that waits its own way when the pipe is empty (an
  agent pump waits under a deadline only then).
* :func:`send_all` writes first; what the pipe does not take at once goes through the
  stream's own ``send_all``, which waits until it can. A write that completes at once is
  no schedule point: the callers (the outboxes) wait on something else after writing.

Only a ``trio.lowlevel.FdStream`` (the agents' pipes and the bridge's own stdin and
stdout) takes this path; every other stream (a socket, the replay wrappers, memory streams
in tests) is used through its own methods. Errors are trio's: ``ClosedResourceError`` for
a stream closed here, ``BrokenResourceError`` for a peer gone.
"""

from __future__ import annotations

import errno
import os

import trio


def _failure(exc: OSError) -> trio.ClosedResourceError | trio.BrokenResourceError:
    if exc.errno == errno.EBADF:
        return trio.ClosedResourceError("file was already closed")
    return trio.BrokenResourceError(exc)


async def receive_some(
    stream: trio.abc.ReceiveStream, max_bytes: int, *, empty: bool = False
) -> bytes | bytearray:
    """``stream.receive_some(max_bytes)``, with no schedule point before the read.
    ``empty``: :func:`receive_ready` has just found the pipe empty: it waits before it reads."""
    if not isinstance(stream, trio.lowlevel.FdStream):
        return await stream.receive_some(max_bytes)
    if not empty:
        data = await receive_ready(stream, max_bytes)
        if data is not None:
            return data
    fd = stream.fileno()
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            return os.read(fd, max_bytes)
        except BlockingIOError:
            continue  # woken without data after all: wait again
        except OSError as exc:
            raise _failure(exc) from exc


async def receive_ready(stream: trio.abc.ReceiveStream, max_bytes: int) -> bytes | None:
    """What a pipe holds now (:func:`read_now`), read as :func:`receive_some` reads it
    when it is ready; None, with no schedule point, when there is nothing yet."""
    # A cancellation comes before the read (as in trio's own receive_some), never after it
    # has taken bytes out of the pipe; it costs no trip to the scheduler otherwise.
    await trio.lowlevel.checkpoint_if_cancelled()
    data = read_now(stream, max_bytes)
    if data is not None:
        await trio.lowlevel.cancel_shielded_checkpoint()
    return data


def read_now(stream: trio.abc.ReceiveStream, max_bytes: int) -> bytes | None:
    """What a ``FdStream``'s pipe holds now (``b""`` at its end), read with no wait and no
    schedule point; None when it holds nothing yet, or ``stream`` is not a pipe. A reader
    reads it through :func:`receive_ready`, and on None waits with ``receive_some(...,
    empty=True)``, which does not try the read again first."""
    if not isinstance(stream, trio.lowlevel.FdStream):
        return None
    try:
        return os.read(stream.fileno(), max_bytes)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise _failure(exc) from exc


async def send_all(stream: trio.abc.SendStream, data: bytes | bytearray | memoryview) -> None:
    """``stream.send_all(data)``, with no schedule point when the pipe takes it all at once."""
    if not isinstance(stream, trio.lowlevel.FdStream) or not data:
        await stream.send_all(data)
        return
    try:
        sent = os.write(stream.fileno(), data)
    except BlockingIOError:
        sent = 0
    except OSError as exc:
        raise _failure(exc) from exc
    if sent < len(data):
        with memoryview(data) as view:
            await stream.send_all(view[sent:])
