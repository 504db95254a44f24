"""Reading and writing a pipe without a trip to the scheduler when it is ready
(``acp_bridge.runtime.pipes``), on real pipes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from unittest import mock

import pytest
import trio
import trio.testing

from acp_bridge.runtime import pipes


class TaskSteps(trio.abc.Instrument):
    """How often each task was resumed by the scheduler."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] = self.steps.get(task.name, 0) + 1


@contextlib.contextmanager
def counting_steps() -> Iterator[TaskSteps]:
    """Each task's steps while the block runs."""
    steps = TaskSteps()
    trio.lowlevel.add_instrument(steps)
    try:
        yield steps
    finally:
        trio.lowlevel.remove_instrument(steps)


@pytest.fixture
async def pipe() -> AsyncIterator[tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]]:
    read_end, write_end = os.pipe()
    reader, writer = trio.lowlevel.FdStream(read_end), trio.lowlevel.FdStream(write_end)
    yield reader, writer
    await reader.aclose()
    await writer.aclose()


async def test_a_write_the_pipe_takes_and_a_read_of_what_is_there_cost_one_schedule_point(
    pipe: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream],
) -> None:
    reader, writer = pipe
    with counting_steps() as steps:
        await pipes.send_all(writer, b"one line\n")
        assert steps.steps == {}  # trio's send_all passes a checkpoint first
        assert await pipes.receive_some(reader, 100) == b"one line\n"
    # The checkpoint after a read that found bytes: a peer that never pauses cannot keep
    # the other tasks from running.
    assert list(steps.steps.values()) == [1]


@pytest.mark.parametrize("after_read_now", [False, True])
async def test_a_read_of_an_empty_pipe_waits_for_what_arrives(
    pipe: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream], after_read_now: bool
) -> None:
    # after_read_now: read_now found the pipe empty, and the read after it (empty=True)
    # waits without trying the read again.
    reader, writer = pipe
    received: list[bytes | bytearray] = []

    async def read() -> None:
        if after_read_now:
            assert pipes.read_now(reader, 100) is None
        received.append(await pipes.receive_some(reader, 100, empty=after_read_now))

    with trio.fail_after(10), mock.patch.object(os, "read", wraps=os.read) as reads:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert received == []
            await pipes.send_all(writer, b"late\n")
    assert received == [b"late\n"]
    assert reads.call_count == 2  # the one that found the pipe empty, the one after the wait


@pytest.mark.parametrize("empty", [False, True])
async def test_a_cancelled_read_leaves_the_bytes_in_the_pipe(
    pipe: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream], empty: bool
) -> None:
    # A pump's read is cancelled (an agent gone past its drain time, the shutdown): as with
    # trio's own receive_some, the cancellation comes before the read, never after it has
    # taken bytes out of the pipe.
    reader, writer = pipe
    await pipes.send_all(writer, b"kept\n")
    received: list[bytes | bytearray] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        received.append(await pipes.receive_some(reader, 100, empty=empty))
    assert scope.cancelled_caught and received == []
    with trio.fail_after(10):
        assert await pipes.receive_some(reader, 100) == b"kept\n"


async def test_a_busy_pipe_still_lets_other_tasks_run(
    pipe: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream],
) -> None:
    reader, writer = pipe
    others = 0

    async def other() -> None:
        nonlocal others
        while True:
            others += 1
            await trio.lowlevel.checkpoint()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            for _ in range(100):
                await pipes.send_all(writer, b"x\n")
                assert await pipes.receive_some(reader, 100) == b"x\n"
            nursery.cancel_scope.cancel()
    assert others >= 99


async def test_what_the_pipe_cannot_take_at_once_waits_for_the_reader(
    pipe: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream],
) -> None:
    reader, writer = pipe
    data = bytes(range(256)) * 8192  # 2 MiB: far more than a pipe holds
    received = bytearray()

    async def read() -> None:
        while len(received) < len(data):
            received.extend(await pipes.receive_some(reader, 1 << 16))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await pipes.send_all(writer, data)
    assert received == data


async def test_a_closed_stream_and_a_gone_reader_are_trios_errors(
    pipe: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream],
) -> None:
    reader, writer = pipe
    await reader.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await pipes.receive_some(reader, 100)
    with pytest.raises(trio.BrokenResourceError):
        await pipes.send_all(writer, b"nobody reads this\n")
    await writer.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await pipes.send_all(writer, b"x\n")


async def test_the_end_of_a_pipe_reads_as_no_bytes(
    pipe: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream],
) -> None:
    reader, writer = pipe
    await pipes.send_all(writer, b"last\n")
    await writer.aclose()
    with trio.fail_after(10):
        assert await pipes.receive_some(reader, 100) == b"last\n"
        assert await pipes.receive_some(reader, 100) == b""


async def test_other_streams_are_used_through_their_own_methods() -> None:
    send, receive = trio.testing.memory_stream_pair()
    with trio.fail_after(10):
        await pipes.send_all(send, b"in memory\n")
        assert await pipes.receive_some(receive, 100) == b"in memory\n"


async def test_read_now_takes_what_waits_and_never_waits(
    pipe: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream],
) -> None:
    reader, writer = pipe
    with counting_steps() as steps:
        assert pipes.read_now(reader, 100) is None  # empty: no wait, no schedule point
        await pipes.send_all(writer, b"waiting\n")  # taken at once: no schedule point
        assert pipes.read_now(reader, 100) == b"waiting\n"
    assert steps.steps == {}
    await writer.aclose()
    assert pipes.read_now(reader, 100) == b""  # the end
    _send, receive = trio.testing.memory_stream_pair()
    assert pipes.read_now(receive, 100) is None  # not a pipe: read through its own methods
