"""The client frames that wait behind interceptions (spec §2, ``core/ordering.Gate``): what
waiting costs, and that the order rules hold whatever the frames and holds are.

The cost is counted in lines of ``ordering.py`` run, not in time: a frame that may go, or
one let go, costs what it names, however many frames wait (up to 4,096 wait: the client
is read no further beyond).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import FrameType
from typing import Any

from fuzz_size import inputs
from hypothesis import example, given, settings
from hypothesis import strategies as st

from acp_bridge.core import ordering
from acp_bridge.core.ordering import Gate, Key, frame_keys, session_key
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import Frame, Kind

WAITING = 2_000
# Lines of ordering.py per frame admitted or let go, at most (about 15 are run).
LINES_PER_FRAME = 40


def notification(session: str | None, method: str = "session/x", **params: Any) -> Frame:
    """A notification naming ``session`` (None: naming none), with ``params`` besides."""
    if session is not None:
        params["sessionId"] = session
    text = {"jsonrpc": "2.0", "method": method, "params": params}
    return jsonrpc.parse(json.dumps(text).encode())


@contextmanager
def lines_run(module: Any) -> Iterator[list[int]]:
    """Count the lines of ``module`` run in the block (the count: the list's one item)."""
    count = [0]
    filename = module.__file__

    def trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if frame.f_code.co_filename != filename:
            return None
        if event == "line":
            count[0] += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield count
    finally:
        sys.settrace(previous)


def test_a_frame_that_may_go_costs_the_same_however_many_frames_wait() -> None:
    gate = Gate()
    gate.hold([session_key("a")], 1, until_answered=True)
    for n in range(WAITING):
        assert not gate.admit(notification("a", n=n))
    others = [notification("b", n=n) for n in range(WAITING)]
    with lines_run(ordering) as count:
        assert all(gate.admit(frame) for frame in others)
    assert count[0] <= LINES_PER_FRAME * len(others)


def test_frames_let_go_behind_frames_that_stay_cost_what_they_name() -> None:
    """Session ``b``'s hold goes while ``a``'s stays: ``b``'s frames go, each judged once,
    not after a walk over ``a``'s every time."""
    gate = Gate()
    gate.hold([session_key("a")], 1, until_answered=True)
    gate.hold([session_key("b")], 2, until_answered=True)
    for n in range(WAITING):
        gate.admit(notification("a", n=n))
    for n in range(WAITING):
        gate.admit(notification("b", n=n))
    gate.answered(2)
    with lines_run(ordering) as count:
        released = list(gate.releasable())
    assert [frame.message["params"]["n"] for frame in released] == list(range(WAITING))
    assert gate.waiting == WAITING
    assert count[0] <= LINES_PER_FRAME * 2 * WAITING


class PlainGate:
    """The order rules as spec §2 states them, each frame judged by a walk over the frames
    before it, and each release walking from the first: the reference the gate is held to."""

    def __init__(self) -> None:
        self.holds: dict[Key, ordering.Hold] = {}
        self.waiting: list[tuple[Frame, list[Key], bool]] = []

    def hold(self, keys: list[Key], token: int, *, until_answered: bool) -> None:
        for key in keys:
            self.holds[key] = ordering.Hold(token, until_answered)

    def hold_for(self, method: str, request_id: int, session: str, token: int) -> None:
        """``initialize`` holds the connection; another request its id and its session,
        until answered, but ``session/prompt`` only until forwarded."""
        if method == "initialize":
            keys = [ordering.CONNECTION]
        else:
            keys = [ordering.request_key(request_id), session_key(session)]
        self.hold(keys, token, until_answered=method != "session/prompt")

    def blocked(self, keys: list[Key], cancels: bool, position: int) -> bool:
        if ordering.CONNECTION in self.holds:
            return True
        for key in keys:
            hold = self.holds.get(key)
            if hold is not None and (not hold.forwarded or (hold.until_answered and not cancels)):
                return True
        earlier = [named for _, named, _ in self.waiting[:position]]
        return any(not named or any(key in named for key in keys) for named in earlier)

    def admit(self, frame: Frame) -> bool:
        keys, cancels = frame_keys(frame)
        waits = self.blocked(keys, cancels, len(self.waiting))
        if waits:
            self.waiting.append((frame, keys, cancels))
        return not waits

    def forwarded(self, token: int) -> None:
        self.holds = {
            key: replace(hold, forwarded=True) if hold.token == token else hold
            for key, hold in self.holds.items()
        }

    def answered(self, token: int) -> None:
        self.holds = {key: hold for key, hold in self.holds.items() if hold.token != token}

    def releasable(self) -> Iterator[Frame]:
        while True:
            for index, (frame, keys, cancels) in enumerate(self.waiting):
                if not self.blocked(keys, cancels, index):
                    del self.waiting[index]
                    yield frame
                    break
            else:
                return


SESSIONS = ["s1", "s2", "s3"]
TOKENS = st.integers(1, 3)
# What the handler of a frame let go does at once: takes a hold, forwards or ends one.
ACTIONS = st.one_of(
    st.none(),
    st.tuples(st.just("hold"), st.sampled_from(SESSIONS), TOKENS, st.booleans()),
    st.tuples(st.sampled_from(["forward", "answer"]), TOKENS),
)


@st.composite
def client_frames(draw: st.DrawFn) -> Frame:
    """A frame naming a session, a request (a cancel of it), both, or nothing; or a batch."""

    def member() -> dict[str, Any]:
        kind = draw(st.sampled_from(["session", "cancel", "cancel_request", "none"]))
        then = draw(ACTIONS)
        params: dict[str, Any] = {"then": then}
        method = "session/x"
        if kind in ("session", "cancel"):
            params["sessionId"] = draw(st.sampled_from(SESSIONS))
            method = "session/cancel" if kind == "cancel" else method
        elif kind == "cancel_request":
            method, params["requestId"] = "$/cancel_request", draw(st.integers(1, 3))
        return {"jsonrpc": "2.0", "method": method, "params": params}

    message: Any = member()
    if draw(st.integers(0, 9)) == 0:
        message = [member() for _ in range(draw(st.integers(1, 3)))]
    return jsonrpc.parse(json.dumps(message).encode())


def request(method: str, request_id: int, session: str) -> Frame:
    params = {"sessionId": session}
    text = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return jsonrpc.parse(json.dumps(text).encode())


ADMIT = st.tuples(st.just("admit"), client_frames())
STEPS = st.one_of(
    ADMIT,
    ADMIT,
    ADMIT,
    st.tuples(
        st.just("hold_for"),
        st.sampled_from(["initialize", "session/load", "session/prompt"]),
        st.integers(1, 3),
        st.sampled_from(SESSIONS),
        TOKENS,
    ),
    st.tuples(st.sampled_from(["forward", "answer"]), TOKENS),
    st.just(("release",)),
)


def act(gate: Any, action: Any) -> None:
    if action is None:
        return
    if action[0] == "hold":
        gate.hold([session_key(action[1])], action[2], until_answered=action[3])
    elif action[0] == "forward":
        gate.forwarded(action[1])
    else:
        gate.answered(action[1])


def release_all(gate: Any) -> list[bytes]:
    """Let go what may go, each frame's members handled (their actions taken) in turn."""
    released = []
    for frame in gate.releasable():
        released.append(frame.raw)
        members = list(frame.message) if frame.kind is Kind.BATCH else [frame.message]
        for member in members:
            act(gate, member["params"]["then"])
    return released


def notify(session: str | None, then: Any = None, method: str = "session/x") -> tuple[str, Frame]:
    """The step that admits a notification whose handler does ``then``."""
    return ("admit", notification(session, method, then=then))


# Frames let go while others stay, and one of them ends the hold those others wait for.
LOOSENED_WHILE_LETTING_GO = [
    ("hold_for", "session/load", 1, "s1", 1),
    ("hold_for", "initialize", 2, "s1", 2),
    notify("s1"),
    notify("s2", ["answer", 1]),
    ("answer", 2),
    ("release",),
]
# The same with a hold forwarded: a cancel goes once its turn has been forwarded.
FORWARDED_WHILE_LETTING_GO = [
    ("hold_for", "session/prompt", 1, "s1", 1),
    ("hold_for", "initialize", 2, "s1", 2),
    notify("s1", method="session/cancel"),
    notify("s2", ["forward", 1]),
    ("answer", 2),
    ("release",),
]
# A frame naming nothing still waits (the connection's hold has gone, no release yet): a
# frame naming a session arriving then waits behind it.
BEHIND_A_FRAME_NAMING_NOTHING = [
    ("hold_for", "initialize", 1, "s1", 1),
    notify(None),
    ("answer", 1),
    notify("s1"),
    ("release",),
]


@settings(max_examples=inputs(1_200), deadline=None)
@given(st.lists(STEPS, min_size=5, max_size=80))
@example(LOOSENED_WHILE_LETTING_GO)
@example(FORWARDED_WHILE_LETTING_GO)
@example(BEHIND_A_FRAME_NAMING_NOTHING)
def test_the_gate_lets_frames_go_as_the_plain_rules_do(steps: list[Any]) -> None:
    gate, plain = Gate(), PlainGate()
    for step in steps:
        if step[0] == "hold_for":
            _, method, request_id, session, token = step
            gate.hold_for(request(method, request_id, session), token)
            plain.hold_for(method, request_id, session, token)
        elif step[0] == "admit":
            assert gate.admit(step[1]) == plain.admit(step[1])
        elif step[0] in ("forward", "answer"):
            act(gate, step)
            act(plain, step)
        elif step[0] == "release":
            assert release_all(gate) == release_all(plain)
        assert [frame.raw for frame, _, _ in gate._waiting] == [
            frame.raw for frame, _, _ in plain.waiting
        ]
        assert gate.waiting_bytes == sum(len(frame.raw) for frame, _, _ in plain.waiting)
        assert gate.active == bool(plain.holds or plain.waiting)
