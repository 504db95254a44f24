"""The fast path for reads of short lines gives what the line-by-line path gives.

A read made of short lines is split in one call (``LineSplitter.feed_short``), each run of
plain notifications in it is validated line by line but passed on as one piece
(``jsonrpc.plain_notifications``, ``Router.pass_notifications_from_client`` / ``_agent``),
and every other line takes the usual way. Each layer is held to the usual path here: the
splitter on random splits of a stream, the run on generated and mutated lines, and the
runtime on random mixes of plain notifications with requests, responses, batches,
``$/cancel_request``, intercepted requests, invalid and blank lines and ``\\r\\n``, cut
into random reads: the agent and the client receive the same bytes in the same order
with the fast path as without it. How many inputs each property draws: :mod:`fuzz_size`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import trio
import trio.testing
from fuzz_size import inputs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from memory_agent import MemorySpawner
from test_parse_fast_path import lines as generated_lines
from test_parse_fast_path import mutated_lines

from acp_bridge.core.router import CLIENT, PRIMARY, Intercept, Router
from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.runtime.trace import Tracer
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.framing import Item, Line, LineSplitter, LongLineStart, OverlongLine
from acp_bridge.wire.jsonrpc import CANCEL_REQUEST, FrameError, Kind, parse, plain_notifications

# ------------------------------------------------------------------ the splitter


def cut(stream: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


def split_plainly(splitter: LineSplitter, reads: list[bytes]) -> list[Item]:
    out: list[Item] = []
    for data in reads:
        out += splitter.feed(data)
    return out + splitter.close()


def split_fast(splitter: LineSplitter, reads: list[bytes]) -> tuple[list[Item], int]:
    """As the pumps split: ``feed_short`` where it takes the read, else ``feed``."""
    out: list[Item] = []
    taken = 0
    for data in reads:
        lines = splitter.feed_short(data)
        if lines is None:
            out += splitter.feed(data)
        else:
            taken += 1
            out += [Line(line) for line in lines]
    return out + splitter.close(), taken


PIECES = st.sampled_from(
    [b'{"a":1}', b"", b"x", b"\r", b"a\rb", b"\r\r", b" ", b"\xc3\xa9", b"y" * 20, b"z" * 40]
)
TERMINATORS = st.sampled_from([b"\n", b"\n", b"\r\n", b"\r\r\n"])


@settings(max_examples=inputs(600), deadline=None)
@given(
    st.lists(st.tuples(st.lists(PIECES, max_size=4), TERMINATORS), max_size=12),
    st.binary(max_size=30),
    st.lists(st.integers(min_value=0), max_size=12),
    st.sampled_from([1, 8, 24, 41, 64, 1000]),
    st.sampled_from([None, None, 4, 16, 30]),
)
def test_feed_short_gives_the_items_feed_gives_whatever_the_reads(
    lines: list[tuple[list[bytes], bytes]],
    tail: bytes,
    cuts: list[int],
    limit: int,
    stream_after: int | None,
) -> None:
    """The same lines, over-long lines and pieces of long lines passed on as they come."""
    stream = b"".join(b"".join(pieces) + end for pieces, end in lines) + tail
    reads = cut(stream, cuts)
    fast, _ = split_fast(LineSplitter(limit, stream_after), reads)
    assert fast == split_plainly(LineSplitter(limit, stream_after), reads)


def test_feed_short_takes_the_reads_of_a_busy_stream() -> None:
    stream = b'{"jsonrpc":"2.0","method":"m"}\r\n' * 100
    reads = cut(stream, range(7, len(stream), 97))
    fast, taken = split_fast(LineSplitter(), reads)
    assert taken == len(reads)
    assert fast == [Line(b'{"jsonrpc":"2.0","method":"m"}')] * 100


def test_feed_short_leaves_a_long_or_over_long_line_to_feed() -> None:
    splitter = LineSplitter(limit=10)
    assert splitter.feed_short(b"0123456789a\n") is None
    assert splitter.buffered == 0  # took nothing
    assert splitter.feed(b"0123456789abc") == []  # now dropping an over-long line
    assert splitter.feed_short(b"\n") is None
    assert splitter.feed(b"\nok\n") == [OverlongLine(13), Line(b"ok")]
    # A whole line that long is left to feed() too: the runtime reads it without building
    # its value.
    whole = LineSplitter(stream_after=100)
    assert whole.feed_short(b"a\n" + b"x" * 100 + b"\nb\n") is None
    assert whole.feed_short(b"x" * 60) == []
    assert whole.feed_short(b"x" * 40 + b"\nb\n") is None  # the held line ends at 100
    assert whole.feed(b"x" * 40 + b"\nb\n") == [Line(b"x" * 100), Line(b"b")]
    streaming = LineSplitter(stream_after=100)
    assert streaming.feed_short(b"a\n" + b"x" * 99) == [b"a"]
    assert streaming.feed_short(b"x") is None  # would make the unfinished line long
    assert streaming.feed(b"x") == [LongLineStart(b"x" * 100)]
    assert streaming.feed_short(b"y\n") is None  # the long line is being passed on


# ------------------------------------------------------- runs of notifications


def is_plain(raw: bytes) -> bool:
    try:
        frame = parse(raw)
    except FrameError:
        return False
    return frame.kind is Kind.NOTIFICATION and frame.method != CANCEL_REQUEST


SETTINGS = settings(
    max_examples=inputs(400), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SETTINGS
@given(st.lists(st.one_of(generated_lines(), mutated_lines()), max_size=6), st.integers(0, 6))
@example([b'{"jsonrpc":"2.0","method":"m"} '], 0)  # trailing whitespace: parse's long way
@example([b'{"jsonrpc":"2.0","method":"m","method":"%s"}' % CANCEL_REQUEST.encode()], 0)
@example([b'{"jsonrpc":"2.0","method":"m","params":{}}{"x":1}'], 0)
@example([b'{"jsonrpc":"2.0","method":"m","params":' + b"[" * 5000 + b"]" * 5000 + b"}"], 0)
def test_a_run_holds_only_lines_parse_reads_as_plain_notifications(
    lines: list[bytes], start: int
) -> None:
    """And the line after the run, when it comes parsed, is what parse makes of it."""
    start = min(start, len(lines))
    end, frame = plain_notifications(lines, start)
    assert start <= end <= len(lines)
    for raw in lines[start:end]:
        assert is_plain(raw), raw
    if frame is not None:
        assert end < len(lines)
        assert frame.raw is lines[end]
        assert frame == parse(lines[end]) and frame.kind is parse(lines[end]).kind
        assert not is_plain(lines[end])


NOTIFICATION_PARAMS = st.one_of(
    st.none(),
    st.dictionaries(st.text(max_size=5), st.one_of(st.text(max_size=8), st.integers()), max_size=3),
)


@settings(max_examples=inputs(300), deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=20), NOTIFICATION_PARAMS), max_size=8))
def test_written_notifications_make_one_run(notes: list[tuple[str, Any]]) -> None:
    """Not a vacuous fast path: notifications as peers write them (compact or spaced,
    escaped or not) pass, up to the first line parse would not read as one."""
    lines = []
    for index, (method, params) in enumerate(notes):
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        compact = (",", ":") if index % 3 else None
        written = json.dumps(message, ensure_ascii=index % 2 == 0, separators=compact)
        lines.append(written.encode("utf-8", "surrogatepass"))
    first_other = next((i for i, raw in enumerate(lines) if not is_plain(raw)), len(lines))
    assert plain_notifications(lines)[0] == first_other


# ------------------------------------------------------------------ the router

NOTE = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{}}}'
OTHER_NOTE = b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}'
CANCEL = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":1}}'
REQUEST = b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s"}}'


class Written:
    """What a router has had its peers sent so far, as (peer, bytes), taken from it
    (:meth:`Router.data_to_send`) whenever it is looked at."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.items: list[tuple[int, bytes]] = []

    def taken(self) -> list[tuple[int, bytes]]:
        self.items.extend((send.peer, send.raw) for send in self.router.data_to_send())
        return self.items

    def __eq__(self, other: object) -> bool:
        return self.taken() == other

    __hash__ = None  # type: ignore[assignment]

    def __getitem__(self, index: int) -> tuple[int, bytes]:
        return self.taken()[index]

    def clear(self) -> None:
        self.taken().clear()


def recording_router() -> tuple[Router, Written]:
    router = Router()
    return router, Written(router)


def test_a_run_goes_to_its_peer_as_one_piece_of_the_bytes_as_they_came() -> None:
    router, written = recording_router()
    lines = [NOTE, OTHER_NOTE, REQUEST, NOTE]
    assert router.pass_notifications_from_client(lines, 0) == (2, parse(REQUEST))
    assert written == [(PRIMARY, NOTE + b"\n" + OTHER_NOTE)]
    assert router.pass_notifications_from_client(lines, 2) == (2, parse(REQUEST))
    assert router.pass_notifications_from_client(lines, 3) == (4, None)
    written.clear()
    assert router.pass_notifications_from_agent([NOTE, CANCEL, NOTE], 0) == (1, parse(CANCEL))
    assert router.pass_notifications_from_agent([NOTE, b"{", NOTE], 0) == (1, None)
    assert router.pass_notifications_from_agent([NOTE, CANCEL, NOTE], 2) == (3, None)
    assert written == [(CLIENT, NOTE), (CLIENT, NOTE), (CLIENT, NOTE)]


def test_nothing_passes_from_the_client_while_frames_are_held_or_several_processes_run() -> None:
    router, written = recording_router()
    initialize = parse(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}')
    (intercept,) = router.receive_from_client(initialize)
    assert isinstance(intercept, Intercept)
    assert router.pass_notifications_from_client([NOTE], 0) == (0, None)  # held
    router.forward(intercept.token, PRIMARY)
    router.answer(intercept.token, b'{"jsonrpc":"2.0","id":0,"result":{}}')
    assert router.pass_notifications_from_client([NOTE], 0) == (1, None)
    assert written[-1] == (PRIMARY, NOTE)
    router.hops.add()
    assert router.pass_notifications_from_client([NOTE], 0) == (0, None)  # the adapter routes
    assert router.pass_notifications_from_agent([NOTE], 0) == (1, None)
    assert written[-1] == (CLIENT, NOTE)


# ------------------------------------------------------------------ the runtime

INITIALIZE = b'{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":1}}\n'
# Intercepted, as every initialize is: the client's frames after it wait for its answer.
SECOND_INITIALIZE = (
    b'{"jsonrpc":"2.0","id":"i2","method":"initialize","params":{"protocolVersion":1}}'
)

CLIENT_LINES = [
    NOTE,
    OTHER_NOTE,
    b'{"jsonrpc":"2.0","method":"x","params":{"text":"\xf0\x9f\x98\x80 \xc3\xbc \\u00e9"}}',
    b'{ "jsonrpc" : "2.0" ,\t"method" : "spaced" }',
    b'{"jsonrpc":"2.0",\r"method":"cr inside"}',
    b'{"jsonrpc":"2.0","method":"trailing space"} ',
    b'{"jsonrpc":"2.0","method":"two values"}{"x":1}',
    b'{"jsonrpc":"2.0","method":"and more"} x',
    b' {"jsonrpc":"2.0","method":"leading space"}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"e1"}}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{}}',
    b'{"jsonrpc":"2.0","id":"e1","method":"_test/echo","params":{"n":1}}',
    b'{"jsonrpc":"2.0","id":7,"method":"_test/unknown"}',
    b'{"jsonrpc":"2.0","id":"nobody","result":{}}',
    b'[{"jsonrpc":"2.0","method":"in a batch"},{"jsonrpc":"2.0","id":"b1","method":"_test/echo"}]',
    b'[{"jsonrpc":"2.0","method":"in a batch"},7]',
    SECOND_INITIALIZE,
    b'{"jsonrpc":"2.0","method":}',
    b"not json",
    b'{"jsonrpc":"2.0","method":"m","params":3}',
    b'{"jsonrpc":"2.0","method":"bad utf-8 \xff"}',
    b'{"jsonrpc":"2.0","method":"deep","params":' + b"[" * 3000 + b"]" * 3000 + b"}",
    b"",
    b"   ",
]

AGENT_LINES = [
    NOTE,
    b'{"jsonrpc":"2.0","method":"session/update",'
    b'"params":{"text":"\xf0\x9d\x84\x9e \\ud834\\udd1e"}}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"a1"}}',
    b'{"jsonrpc":"2.0","id":"a1","method":"fs/read_text_file","params":{"path":"/x"}}',
    b'{"jsonrpc":"2.0","id":99,"result":{"late":true}}',
    b'[{"jsonrpc":"2.0","method":"in a batch"},{"jsonrpc":"2.0","method":"too"}]',
    b'[{"jsonrpc":"2.0","method":"in a batch"},"not a message"]',
    b'{"jsonrpc":"2.0","method":"trailing tab"}\t',
    b"not json",
    b"",
]


async def relay_reads(
    client_reads: list[bytes],
    agent_reads: list[bytes],
    tracer: Tracer | None = None,
    *,
    piped: bool = False,
) -> tuple[list[bytes], bytes]:
    """Send each read on its own (the bridge takes it before the next is sent): the client's
    through the bridge's stdin, the agent's through its stdout (``piped``: a real pipe). What
    the agent received, line by line, and the client, byte by byte."""
    to_bridge, bridge_in = trio.testing.memory_stream_one_way_pair()
    bridge_out, from_bridge = trio.testing.memory_stream_one_way_pair()
    store = SessionStore(":memory:")
    received = bytearray()
    finished = trio.Event()

    async def read_client() -> None:
        while data := await from_bridge.receive_some(1 << 20):
            received.extend(data)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery, trio.open_nursery() as reading:
            spawner = MemorySpawner(nursery, piped_output=piped)
            bridge = Bridge(
                BridgeOptions(
                    agent_argv=["memory-agent"], adapter="passthrough", shutdown_grace=0.5
                ),
                bridge_in,
                bridge_out,
                Lifecycle(store, "memory-agent"),
                spawner=spawner,
                tracer=tracer,
            )

            async def run() -> None:
                await bridge.run(watch_signals=False)
                finished.set()

            reading.start_soon(read_client)
            nursery.start_soon(run)
            await to_bridge.send_all(INITIALIZE)
            while b"\n" not in received:
                await trio.testing.wait_all_tasks_blocked()
            (agent,) = spawner.agents
            for data in client_reads:
                await to_bridge.send_all(data)
                await trio.testing.wait_all_tasks_blocked()
            for data in agent_reads:
                await agent.send_bytes(data)
                await trio.testing.wait_all_tasks_blocked()
            await to_bridge.aclose()
            await finished.wait()
            # The bridge does not close its output; what it wrote has been read once the
            # reader waits again.
            await trio.testing.wait_all_tasks_blocked()
            reading.cancel_scope.cancel()
    store.close()
    return agent.received_raw, bytes(received)


def relayed(
    client_reads: list[bytes], agent_reads: list[bytes], *, fast: bool
) -> tuple[list[bytes], bytes]:
    if fast:
        return trio.run(relay_reads, client_reads, agent_reads)
    with mock.patch.object(LineSplitter, "feed_short", return_value=None):
        return trio.run(relay_reads, client_reads, agent_reads)


@st.composite
def streams(draw: st.DrawFn, pool: list[bytes]) -> list[bytes]:
    """Lines from ``pool`` (plain notifications more often than not), in random reads."""
    picks = st.one_of(st.sampled_from(pool[:2]), st.sampled_from(pool))
    chosen = draw(st.lists(st.tuples(picks, TERMINATORS), min_size=1, max_size=25))
    stream = b"".join(line + end for line, end in chosen)
    return cut(stream, draw(st.lists(st.integers(min_value=0), max_size=8)))


RUNTIME = settings(
    max_examples=inputs(100), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@RUNTIME
@given(streams(CLIENT_LINES))
@example([b"\n".join([NOTE, SECOND_INITIALIZE, NOTE, b"{", NOTE, b""])])
def test_client_reads_reach_the_agent_as_they_do_line_by_line(reads: list[bytes]) -> None:
    assert relayed(reads, [], fast=True) == relayed(reads, [], fast=False)


@RUNTIME
@given(streams(AGENT_LINES))
def test_agent_reads_reach_the_client_as_they_do_line_by_line(reads: list[bytes]) -> None:
    assert relayed([], reads, fast=True) == relayed([], reads, fast=False)


# Long lines an agent may write, valid (an invalid one's cut depends on how the reads fall,
# which a pipe does not keep: tests/test_long_lines.py's fuzz sends those through a pipe).
LONG_AGENT_LINES = [
    *AGENT_LINES,
    b'{"jsonrpc":"2.0","method":"session/update","params":{"blob":"' + b"x" * 200_000 + b'"}}',
    b'{"jsonrpc":"2.0","method":"session/update","params":{"text":"'
    + "\u00e9 é 😀".encode() * 20_000
    + b'","n":[1,2,3]}}',
]


@settings(max_examples=inputs(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(LONG_AGENT_LINES))
def test_agent_output_read_from_a_pipe_reaches_the_client_as_from_memory(
    reads: list[bytes],
) -> None:
    """An agent pump reads a pipe with ``pipes.read_now`` first and waits only when it is
    empty; a memory stream through its own reads. The client gets the same bytes."""
    piped = trio.run(partial(relay_reads, [], reads, piped=True))
    assert piped == trio.run(relay_reads, [], reads)
    assert piped[1].count(b"\n") >= 1  # initialize's answer, at least


def test_a_mixed_read_keeps_order_and_bytes() -> None:
    """One read each way: notifications around an intercepted request, a request, an
    invalid line, a batch and ``\\r\\n`` lines."""
    echo = b'{"jsonrpc":"2.0","id":"e1","method":"_test/echo","params":{"n":1}}'
    batch = b'[{"jsonrpc":"2.0","method":"in a batch"}]'
    client_read = b"\n".join(
        [
            NOTE,
            SECOND_INITIALIZE,
            OTHER_NOTE + b"\r",
            b"not json",
            echo,
            batch,
            NOTE + b"\r",
            NOTE,
            b"",
        ]
    )
    agent_request = b'{"jsonrpc":"2.0","id":"a1","method":"fs/read_text_file","params":{}}'
    agent_read = b"\n".join([NOTE + b"\r", agent_request, b"{", NOTE, batch, NOTE, b""])
    for fast in (True, False):
        agent_got, client_got = relayed([client_read], [agent_read], fast=fast)
        # The notification before initialize passes at once; the frames after it wait for
        # its answer, in order.
        assert agent_got == [
            INITIALIZE[:-1],
            NOTE,
            SECOND_INITIALIZE,
            OTHER_NOTE,
            echo,
            batch,
            NOTE,
            NOTE,
        ]
        answers = client_got.splitlines()
        assert answers[0].startswith(b'{"jsonrpc":"2.0","id":"init","result":')
        # The bridge answers the invalid line at once; it waits for nothing.
        assert json.loads(answers[1])["error"]["code"] == jsonrpc.PARSE_ERROR
        assert answers[2].startswith(b'{"jsonrpc":"2.0","id":"i2","result":')
        assert answers[3] == b'{"jsonrpc":"2.0","id":"e1","result":{"n":1}}'
        assert answers[4:] == [NOTE, agent_request, NOTE, batch, NOTE]


def test_a_flood_of_notifications_is_read_once_and_makes_no_frames() -> None:
    """The fast path is taken: each line is scanned once, and only the two that are not
    plain notifications (initialize and its answer) become frames."""
    reads = [b"".join(line + b"\n" for line in [NOTE, OTHER_NOTE] * 300)]
    with (
        mock.patch.object(jsonrpc, "_scan_once", wraps=jsonrpc._scan_once) as scans,
        mock.patch.object(jsonrpc, "_classify_short", wraps=jsonrpc._classify_short) as frames,
    ):
        agent_got, client_got = relayed(reads, reads, fast=True)
    assert agent_got[1:] == [NOTE, OTHER_NOTE] * 300
    assert client_got.splitlines()[1:] == [NOTE, OTHER_NOTE] * 300
    assert scans.call_count == 2 + 2 * 600
    assert frames.call_count == 2


def test_a_traced_flood_is_traced_frame_by_frame(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    reads = [b"".join(line + b"\n" for line in [NOTE, OTHER_NOTE] * 50)]
    agent_got, client_got = trio.run(partial(relay_reads, reads, reads, tracer=Tracer(trace)))
    assert agent_got[1:] == [NOTE, OTHER_NOTE] * 50
    assert client_got.splitlines()[1:] == [NOTE, OTHER_NOTE] * 50
    directions = [json.loads(line)["dir"] for line in trace.read_bytes().splitlines()]
    assert directions.count("client->bridge") == 101
    assert directions.count("agent->bridge") == 101


class CountingLines(list[bytes]):
    """The lines of a read, counting how many of them are looked at (one per item taken
    by iteration or indexing, a slice's length for a slice)."""

    touched = 0

    def __iter__(self) -> Iterator[bytes]:
        for line in super().__iter__():
            CountingLines.touched += 1
            yield line

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        CountingLines.touched += len(item) if isinstance(index, slice) else 1
        return item


def lines_touched(client_reads: list[bytes], agent_reads: list[bytes]) -> int:
    feed_short = LineSplitter.feed_short

    def counting(splitter: LineSplitter, data: bytes) -> list[bytes] | None:
        lines = feed_short(splitter, data)
        return None if lines is None else CountingLines(lines)

    CountingLines.touched = 0
    with mock.patch.object(LineSplitter, "feed_short", counting):
        trio.run(relay_reads, client_reads, agent_reads)
    return CountingLines.touched


def test_a_read_of_blank_lines_is_read_in_work_linear_in_its_lines() -> None:
    """Each line of a read is looked at a bounded number of times, however many lines
    the read has (each blank line once restarted the walk from the read's first line)."""
    for count in (2_000, 8_000):
        blank = [b"\n" * count, (NOTE + b"\n\n") * (count // 2)]
        assert lines_touched(blank, []) <= 4 * count + 20
        assert lines_touched([], blank) <= 4 * count + 20
