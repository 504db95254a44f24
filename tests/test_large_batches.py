"""Large batches: routed member by member, holding about the batch's own size.

JSON-RPC lets a peer send many messages as one line. A batch of small members decoded
whole costs a Python object or more per member (about 25 times the line), so a batch at
the line limit would take gigabytes. The router walks a batch's members one at a time and
keeps what it passes on as bytes; a member it does not change goes on as it came.
"""

from __future__ import annotations

import json
from typing import Any

from peak_memory import peak_while

from acp_bridge.core.router import CLIENT, PRIMARY, Answered, Router
from acp_bridge.wire import jsonrpc

MEMBERS = 5_000  # about 350 KiB of small members


def batch(members: list[bytes]) -> bytes:
    return b"[" + b",".join(members) + b"]"


def note(n: int) -> bytes:
    return b'{"jsonrpc":"2.0","method":"x/note","params":{"n":%d,"text":"a note"}}' % n


def answer(n: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"result":{"n":%d, "spaced" : true}}' % (n, n)


def sent(router: Router) -> list[tuple[int, bytes]]:
    return [(send.peer, send.raw) for send in router.data_to_send()]


def test_a_large_client_batch_goes_on_as_it_came_holding_about_its_size() -> None:
    router = Router()
    line = batch([note(n) for n in range(MEMBERS)])
    out: list[tuple[int, bytes]] = []
    peak = peak_while(lambda: out.extend(sent_after(router, line)))
    assert out == [(PRIMARY, line)]
    assert peak < 3 * len(line)


def sent_after(router: Router, line: bytes) -> list[tuple[int, bytes]]:
    router.receive_from_client(jsonrpc.parse(line))
    return sent(router)


def test_a_large_agent_batch_of_answers_goes_on_as_it_came_holding_about_its_size() -> None:
    router = Router()
    for n in range(MEMBERS):
        router.receive_from_client(jsonrpc.parse(b'{"jsonrpc":"2.0","id":%d,"method":"x/y"}' % n))
    sent(router)
    line = batch([answer(n) for n in range(MEMBERS)])
    out: list[tuple[int, bytes]] = []

    def route() -> None:
        router.receive_from_agent(PRIMARY, jsonrpc.parse(line))
        out.extend(sent(router))

    peak = peak_while(route)
    assert out == [(CLIENT, line)]
    assert peak < 3 * len(line)


def test_a_changed_batch_keeps_the_members_it_does_not_change_byte_for_byte() -> None:
    router = Router()
    waiter = router.request(PRIMARY, "x/own", {})
    ((_, own),) = sent(router)
    own_id = json.loads(own)["id"]
    for n in range(MEMBERS):
        router.receive_from_client(
            jsonrpc.parse(b'{"jsonrpc":"2.0","id":"c%d","method":"x/y"}' % n)
        )
    sent(router)
    answers = [answer(n).replace(b'"id":%d' % n, b'"id":"c%d"' % n) for n in range(MEMBERS)]
    mine = b'{"jsonrpc":"2.0","id":%s,"result":{}}' % json.dumps(own_id).encode()
    line = batch([*answers[:10], mine, *answers[10:]])
    out: list[tuple[int, bytes]] = []
    events: list[Any] = []

    def route() -> None:
        events.extend(router.receive_from_agent(PRIMARY, jsonrpc.parse(line)))
        out.extend(sent(router))

    peak = peak_while(route)
    assert [e.waiter for e in events if isinstance(e, Answered)] == [waiter]
    # The bridge's own answer is taken out; every other member is as the agent wrote it.
    assert out == [(CLIENT, batch(answers))]
    assert peak < 4 * len(line)


def test_a_large_batch_that_breaks_at_its_end_is_refused_holding_about_its_size() -> None:
    router = Router()
    line = batch([note(n) for n in range(MEMBERS)])[:-1]  # no closing bracket
    out: list[tuple[int, bytes]] = []
    peak = peak_while(lambda: out.extend(refused(router, line)))
    ((peer, raw),) = out
    assert peer == CLIENT
    error = json.loads(raw)["error"]
    assert error["code"] == jsonrpc.PARSE_ERROR
    assert error["message"] == (
        f"The line is not valid JSON: Expecting ',' delimiter: line 1 column {len(line) + 1} "
        f"(char {len(line)})."
    )
    assert peak < 3 * len(line)


def refused(router: Router, line: bytes) -> list[tuple[int, bytes]]:
    try:
        jsonrpc.parse(line)
    except jsonrpc.FrameError as exc:
        router.answer_error(exc.request_id, exc.code, exc.message)
    return sent(router)
