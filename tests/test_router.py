"""The sans-IO router: frames in, bytes and events out; no streams, no processes, no clock."""

from __future__ import annotations

import json
from typing import Any

from acp_bridge.core.router import CLIENT, INITIALIZE, Abandoned, Answered, Intercept, Router
from acp_bridge.wire import jsonrpc


class Wire:
    """A router, and what each peer would receive from it."""

    def __init__(
        self,
        hops: int = 1,
        *,
        intercepted: frozenset[str] = frozenset({INITIALIZE}),
        placed: dict[str, int] | None = None,
    ) -> None:
        self._sent: list[tuple[int, bytes]] = []
        self.router = Router(intercepted=intercepted)
        for _ in range(hops - 1):
            self.router.hops.add()
        for session_id, hop in (placed or {}).items():
            self.router.hops.place(session_id, hop)

    @property
    def sent(self) -> list[tuple[int, bytes]]:
        """What the router has had to send so far, as (peer, bytes)."""
        self._sent.extend((send.peer, send.raw) for send in self.router.data_to_send())
        return self._sent

    @sent.setter
    def sent(self, value: list[tuple[int, bytes]]) -> None:
        self._sent = value

    def client(self, message: Any) -> list[Any]:
        return self.router.receive_from_client(frame(message))

    def agent(self, hop: int, message: Any) -> list[Any]:
        return self.router.receive_from_agent(hop, frame(message))

    def take(self, peer: int) -> list[Any]:
        """What ``peer`` received since the last look, decoded."""
        mine = [json.loads(raw) for to, raw in self.sent if to == peer]
        self.sent = [(to, raw) for to, raw in self.sent if to != peer]
        return mine

    def raw(self, peer: int) -> list[bytes]:
        return [raw for to, raw in self.sent if to == peer]


def frame(message: Any) -> jsonrpc.Frame:
    if isinstance(message, bytes):
        return jsonrpc.parse(message)
    return jsonrpc.parse(json.dumps(message).encode())


def request(request_id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def result(request_id: Any, value: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value if value is not None else {}}


def notification(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


LIFECYCLE = frozenset({"initialize", "session/new", "session/load", "session/prompt"})


def test_untouched_frames_keep_their_bytes_both_ways() -> None:
    wire = Wire()
    line = b'{"jsonrpc": "2.0",  "id": 7, "method": "x/y", "params": {"b": 1, "a": 2}}'
    wire.router.receive_from_client(jsonrpc.parse(line))
    assert wire.raw(0) == [line]
    answer = b'{ "id": 7, "jsonrpc": "2.0", "result": {"z": "\\u00e9"} }'
    wire.router.receive_from_agent(0, jsonrpc.parse(answer))
    assert wire.raw(CLIENT) == [answer]


def test_client_id_in_flight_on_the_hop_is_translated_and_restored() -> None:
    wire = Wire()
    waiter = wire.router.request(0, "_bridge/own", {})
    (own,) = wire.take(0)
    wire.client(request(own["id"], "x/y"))
    (relayed,) = wire.take(0)
    assert relayed["id"] != own["id"]
    wire.client(notification("$/cancel_request", requestId=own["id"]))
    assert wire.take(0) == [notification("$/cancel_request", requestId=relayed["id"])]
    events = wire.agent(0, result(relayed["id"], {"for": "client"}))
    assert events == []
    assert wire.take(CLIENT) == [result(own["id"], {"for": "client"})]
    (answered,) = wire.agent(0, result(own["id"], {"for": "bridge"}))
    assert isinstance(answered, Answered) and answered.waiter == waiter


def test_cancel_without_request_id_passes_as_it_came() -> None:
    wire = Wire(hops=2, placed={"other": 1})
    wire.client(request(None, "x/other", sessionId="other"))
    assert wire.take(1) == [request(None, "x/other", sessionId="other")]
    line = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{}}'
    wire.router.receive_from_client(jsonrpc.parse(line))
    assert wire.raw(0) == [line]
    assert wire.raw(1) == []


def test_agent_requests_with_one_id_from_two_hops_answered_in_one_client_batch() -> None:
    wire = Wire(hops=2)
    wire.agent(0, request(0, "session/request_permission"))
    wire.agent(1, request(0, "session/request_permission"))
    first, second = wire.take(CLIENT)
    assert first["id"] == 0 and second["id"] != 0
    wire.client([result(first["id"], {"outcome": "a"}), result(second["id"], {"outcome": "b"})])
    assert wire.take(0) == [[result(0, {"outcome": "a"})]]
    assert wire.take(1) == [[result(0, {"outcome": "b"})]]


def test_agent_cancel_of_its_translated_request_is_translated_for_the_client() -> None:
    wire = Wire(hops=2)
    wire.agent(0, request(5, "fs/read_text_file"))
    wire.agent(1, request(5, "fs/read_text_file"))
    _, translated = wire.take(CLIENT)
    wire.agent(1, notification("$/cancel_request", requestId=5))
    assert wire.take(CLIENT) == [notification("$/cancel_request", requestId=translated["id"])]


def test_intercepted_request_answered_inside_an_agent_batch_wakes_its_waiter() -> None:
    wire = Wire(intercepted=LIFECYCLE)
    (start,) = wire.client(request(1, "session/new", cwd="/"))
    assert isinstance(start, Intercept)
    waiter, _ = wire.router.forward(start.token, 0)
    assert waiter is not None
    wire.take(0)
    events = wire.agent(0, [result(1, {"sessionId": "s"}), notification("x/note")])
    assert [e.waiter for e in events if isinstance(e, Answered)] == [waiter]
    # The answer is the bridge's; the client gets only the rest of the batch.
    assert wire.take(CLIENT) == [[notification("x/note")]]


def test_client_batch_reusing_an_intercepted_id_in_flight_does_not_steal_its_answer() -> None:
    wire = Wire(intercepted=LIFECYCLE)
    (start,) = wire.client(request(7, "session/new", cwd="/"))
    waiter, _ = wire.router.forward(start.token, 0)
    wire.take(0)
    wire.client([request(7, "x/other"), notification("x/note")])
    ((member, note),) = wire.take(0)
    assert member["id"] != 7 and note == notification("x/note")
    events = wire.agent(0, result(7, {"sessionId": "s"}))
    assert [e.waiter for e in events if isinstance(e, Answered)] == [waiter]
    wire.agent(0, result(member["id"], {"other": True}))
    assert wire.take(CLIENT) == [result(7, {"other": True})]


def test_client_batch_members_go_to_the_hop_their_session_lives_in() -> None:
    wire = Wire(hops=2, placed={"b": 1})
    wire.client([request(1, "x/y", sessionId="a"), request(2, "x/y", sessionId="b")])
    assert wire.take(0) == [[request(1, "x/y", sessionId="a")]]
    assert wire.take(1) == [[request(2, "x/y", sessionId="b")]]


def test_a_session_goes_where_it_was_placed_and_the_router_calls_no_one() -> None:
    # Routing is a lookup in the router's own table, filled with values as the adapter
    # places sessions: no callback is configured, and none is needed.
    wire = Wire(hops=3)
    wire.router.hops.place("b", 1)
    wire.router.hops.place("c", 2)
    wire.client(request(1, "session/prompt", sessionId="b", prompt=[]))
    wire.client(notification("session/cancel", sessionId="c"))
    wire.client(request(2, "session/set_mode", sessionId="a", modeId="m"))
    wire.client(request(3, "session/list"))
    assert [m["id"] for m in wire.take(1)] == [1]
    assert wire.take(2) == [notification("session/cancel", sessionId="c")]
    assert [m["id"] for m in wire.take(0)] == [2, 3]
    # Moved back to the primary, then gone: both go to the primary.
    wire.router.hops.place("b", 0)
    wire.router.hops.unplace("c")
    wire.client(request(4, "session/prompt", sessionId="b", prompt=[]))
    wire.client(notification("session/cancel", sessionId="c"))
    assert [m.get("id", m.get("method")) for m in wire.take(0)] == [4, "session/cancel"]
    assert wire.take(1) == [] and wire.take(2) == []


def test_batch_holding_an_intercepted_method_is_refused_whole() -> None:
    wire = Wire(intercepted=LIFECYCLE)
    wire.client([request(1, "session/new", cwd="/"), request(2, "x/y")])
    (errors,) = wire.take(CLIENT)
    assert [e["id"] for e in errors] == [1, 2]
    assert {e["error"]["code"] for e in errors} == {jsonrpc.INVALID_REQUEST}
    assert wire.take(0) == []


def test_malformed_batch_member_is_answered_by_the_bridge_and_the_rest_goes() -> None:
    wire = Wire()
    wire.client([request(1, "x/y"), 42])
    assert wire.take(0) == [[request(1, "x/y")]]
    (error,) = wire.take(CLIENT)
    assert error["error"]["code"] == jsonrpc.INVALID_REQUEST


def test_batch_member_whose_method_is_not_a_string_is_answered_with_its_id() -> None:
    # A list or an object where the method goes is no JSON-RPC request: it gets -32600
    # under its own id and the other members still go, whether or not methods are
    # intercepted (the check for intercepted methods once hashed the value and crashed).
    for intercepted in (frozenset({"initialize"}), LIFECYCLE):
        for odd in (["x"], {}, {"a": [1]}, 1, None, True):
            wire = Wire(intercepted=intercepted)
            wire.client([{"jsonrpc": "2.0", "id": 1, "method": odd}, request(2, "x/y")])
            assert wire.take(0) == [[request(2, "x/y")]]
            (error,) = wire.take(CLIENT)
            assert (error["id"], error["error"]["code"]) == (1, jsonrpc.INVALID_REQUEST)
            wire.client(request(3, "x/y"))
            assert wire.take(0) == [request(3, "x/y")]


def test_agent_batch_member_whose_method_is_not_a_string_is_dropped() -> None:
    wire = Wire()
    wire.agent(0, [{"jsonrpc": "2.0", "id": 1, "method": ["x"]}, notification("x/n")])
    assert wire.take(CLIENT) == [[notification("x/n")]]


def test_initialize_holds_every_client_frame_until_it_is_answered() -> None:
    wire = Wire()
    (start,) = wire.client(request(0, "initialize", protocolVersion=1))
    wire.router.forward(start.token, 0)
    wire.take(0)
    wire.client(request(1, "session/new", cwd="/"))
    wire.client(request(2, "x/y"))
    assert wire.take(0) == []
    wire.router.configure(intercepted=LIFECYCLE)
    events = wire.router.answer(start.token, jsonrpc.encode(result(0)))
    # session/new is now intercepted (the adapter is known); x/y follows at once.
    assert [type(e) for e in events] == [Intercept]
    assert wire.take(0) == [request(2, "x/y")]


def test_only_frames_naming_the_held_session_wait_for_a_lifecycle_request() -> None:
    wire = Wire(intercepted=LIFECYCLE)
    (start,) = wire.client(request(1, "session/load", sessionId="s", cwd="/"))
    wire.client(notification("session/cancel", sessionId="s"))
    wire.client(request(2, "session/set_mode", sessionId="s", modeId="m"))
    wire.client(request(3, "session/set_mode", sessionId="other", modeId="m"))
    wire.client(result("perm-1", {"outcome": "allow"}))
    wire.client(notification("x/note"))
    assert [m.get("id", m.get("method")) for m in wire.take(0)] == [3, "perm-1", "x/note"]
    # Forwarded: the cancel may go (it cannot overtake the load now), the rest still waits.
    wire.router.forward(start.token, 0)
    assert [m.get("id", m.get("method")) for m in wire.take(0)] == [1, "session/cancel"]
    wire.router.answer(start.token, jsonrpc.encode(result(1)))
    assert [m.get("id") for m in wire.take(0)] == [2]


def test_an_intercepted_prompt_holds_its_session_only_until_forwarded() -> None:
    wire = Wire(intercepted=LIFECYCLE)
    (start,) = wire.client(request(1, "session/prompt", sessionId="s", prompt=[]))
    wire.client(notification("$/cancel_request", requestId=1))
    wire.client(request(2, "session/set_mode", sessionId="s", modeId="m"))
    assert wire.take(0) == []
    wire.router.forward(start.token, 0)
    assert [m.get("id", m.get("method")) for m in wire.take(0)] == [1, "$/cancel_request", 2]


def test_frames_that_wait_keep_their_order_and_a_second_interception_queues() -> None:
    wire = Wire(intercepted=LIFECYCLE)
    (first,) = wire.client(request(1, "session/load", sessionId="s", cwd="/"))
    wire.router.forward(first.token, 0)
    wire.take(0)
    assert wire.client(request(2, "session/load", sessionId="s", cwd="/")) == []
    wire.client(request(3, "x/y", sessionId="s"))
    (second,) = wire.router.answer(first.token, jsonrpc.encode(result(1)))
    assert isinstance(second, Intercept) and second.frame.id == 2
    assert wire.take(0) == []  # x/y waits behind the second load
    wire.router.forward(second.token, 0)
    wire.router.answer(second.token, jsonrpc.encode(result(2)))
    assert [m["id"] for m in wire.take(0)] == [2, 3]


def test_a_hop_that_exits_fails_its_client_requests_and_abandons_its_waiters() -> None:
    wire = Wire(hops=2, placed={"s": 1})
    wire.client(request("c", "x/y", sessionId="s"))
    waiter = wire.router.request(1, "_bridge/own", {})
    assert waiter is not None
    assert wire.router.hop_closed(1, 3) == [Abandoned(waiter, 3)]
    (error,) = wire.take(CLIENT)
    assert error["id"] == "c" and error["error"]["data"] == {"exitStatus": 3}
    # Later traffic for that process goes to the primary (routing falls back).
    wire.client(request("d", "x/y", sessionId="s"))
    assert [m["id"] for m in wire.take(0)] == ["d"]


def test_agent_frames_about_a_session_wait_until_its_intercepted_answer_is_sent() -> None:
    wire = Wire(intercepted=LIFECYCLE)
    (start,) = wire.client(request(1, "session/new", cwd="/"))
    waiter, _ = wire.router.forward(start.token, 0)
    wire.take(0)
    # The agent answers, then at once sends the new session's commands, an update of
    # another session and a permission request of the new one.
    (answered,) = wire.agent(0, result(1, {"sessionId": "new"}))
    assert isinstance(answered, Answered) and answered.waiter == waiter
    wire.agent(0, notification("session/update", sessionId="new", n=1))
    wire.agent(0, notification("session/update", sessionId="old", n=2))
    wire.agent(0, request("perm", "session/request_permission", sessionId="new"))
    wire.agent(0, notification("x/odd", sessionId={"not": "a string"}))
    assert [m["method"] for m in wire.take(CLIENT)] == ["session/update", "x/odd"]
    # The runtime records the session, then answers: the rest follows, in order.
    wire.router.answer(start.token, jsonrpc.encode(result(1, {"sessionId": "new"})))
    assert [m.get("id", m.get("params", {}).get("n")) for m in wire.take(CLIENT)] == [1, 1, "perm"]
    wire.agent(0, notification("session/update", sessionId="new", n=3))
    assert wire.take(CLIENT) == [notification("session/update", sessionId="new", n=3)]


def test_everything_the_agent_sends_after_its_initialize_answer_waits_for_the_bridges() -> None:
    wire = Wire()
    (start,) = wire.client(request(0, "initialize", protocolVersion=1))
    wire.router.forward(start.token, 0)
    wire.agent(0, result(0, {"protocolVersion": 1}))
    wire.agent(0, notification("x/early"))
    assert wire.take(CLIENT) == []
    wire.router.answer(start.token, jsonrpc.encode(result(0, {"protocolVersion": 1})))
    assert [m.get("id", m.get("method")) for m in wire.take(CLIENT)] == [0, "x/early"]


def test_what_waits_behind_an_answer_is_counted_and_what_the_runtime_awaits_is_known() -> None:
    # What the runtime needs to bound an agent's frames held behind an answer (frames and
    # bytes per hop) without stopping an answer it waits for itself.
    wire = Wire()
    (start,) = wire.client(request(0, "initialize", protocolVersion=1))
    assert wire.router.answer_hold.held(0) == (0, 0)
    wire.router.forward(start.token, 0)
    assert wire.router.hops[0].pending.awaited()
    wire.agent(0, result(0, {"protocolVersion": 1}))
    assert not wire.router.hops[0].pending.awaited()
    notes = [json.dumps(notification("x/early", n=n)).encode() for n in range(3)]
    for note in notes:
        wire.agent(0, note)
    assert wire.router.answer_hold.held(0) == (3, sum(map(len, notes)))
    own = wire.router.request(0, "_x/ask", {})
    assert own is not None and wire.router.hops[0].pending.awaited()
    wire.agent(0, result(wire.take(0)[-1]["id"], {}))
    assert not wire.router.hops[0].pending.awaited()
    wire.router.answer(start.token, jsonrpc.encode(result(0, {"protocolVersion": 1})))
    assert wire.router.answer_hold.held(0) == (0, 0)
    assert [m.get("method") for m in wire.take(CLIENT)] == [None, "x/early", "x/early", "x/early"]


def test_an_agent_answering_a_request_twice_reaches_the_client_once(caplog: Any) -> None:
    wire = Wire()
    wire.client(request(1, "x/y"))
    wire.agent(0, result(1, {"first": True}))
    wire.agent(0, result(1, {"second": True}))
    wire.agent(0, [result(1, {"third": True}), notification("x/n")])
    wire.agent(0, result("never-asked"))
    assert wire.take(CLIENT) == [result(1, {"first": True}), [notification("x/n")]]
    dropped = [r.getMessage() for r in caplog.records if "no request" in r.getMessage()]
    assert len(dropped) == 3


def test_a_refused_batch_answers_every_member_that_names_an_id() -> None:
    wire = Wire(intercepted=LIFECYCLE)
    wire.client(
        [
            request(1, "session/new", cwd="/"),
            {"jsonrpc": "2.0", "id": 2, "params": {}},  # no method, no result
            {"jsonrpc": "2.0", "id": 3, "method": ["x"]},
            {"jsonrpc": "2.0", "id": [4], "method": "x"},  # no id to answer under
            notification("x/n"),
            result(5),
        ]
    )
    (errors,) = wire.take(CLIENT)
    assert [e["id"] for e in errors] == [1, 2, 3]
    assert {e["error"]["code"] for e in errors} == {jsonrpc.INVALID_REQUEST}
    assert wire.take(0) == []
