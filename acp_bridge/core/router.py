"""The router: where each frame goes, under which id, and when.

:class:`Router` is the bridge's protocol state for one client connection and its agent
connections ("hops"; hop 0 is the primary agent process). It owns

* the pending-request table of every hop (:mod:`acp_bridge.core.pending`), for single
  messages and batch members alike, in both directions;
* the client-facing ids of requests the agents send to the client
  (:class:`~acp_bridge.core.pending.AgentRequests`), and the translation of
  ``$/cancel_request`` both ways (a cancel without ``requestId`` passes as it came);
* the interceptions in progress, and the order of frames around them both ways
  (:mod:`acp_bridge.core.ordering`).

The agent processes and where each session lives among them are
:class:`~acp_bridge.core.hops.Hops` (:attr:`Router.hops`): routing a frame to a process
is a lookup there, never a call out.

It does no I/O and calls nothing it is not made with. Like h11's connection it owns its
output: the bytes each peer must get queue in the router, in the order the peer must
receive them, until the runtime takes them (:meth:`Router.data_to_send`, a list of
:class:`Send`); a frame the router does not change is passed as the very bytes it arrived
as. What the runtime must do besides writing is returned by the call that caused it, as
events: start an interception (:class:`Intercept`), hand an answer to a waiter
(:class:`Answered`), or tell a waiter its request is lost with the agent process
(:class:`Abandoned`).

Its configuration comes in through :meth:`Router.configure` once the client's
``initialize`` is answered: which client methods are intercepted.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from acp_bridge.core.exits import describe_exit
from acp_bridge.core.hops import PRIMARY as PRIMARY  # noqa: PLC0414
from acp_bridge.core.hops import Hops
from acp_bridge.core.ordering import INITIALIZE as INITIALIZE  # noqa: PLC0414
from acp_bridge.core.ordering import AnswerHold, Gate
from acp_bridge.core.pending import AgentRequests, ForWaiter, FromClient
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import (
    CANCEL_REQUEST,
    Batch,
    Frame,
    JsonObject,
    Kind,
    RequestId,
    classify_message,
    is_request_id,
)

log = logging.getLogger("acp_bridge.router")

CLIENT: Final = -1

AGENT_ANSWER_REFUSED: Final = (
    "The agent's answer was not valid JSON-RPC; the bridge could not pass it on."
)


@dataclass(frozen=True, slots=True)
class Send:
    """Write ``raw`` to ``peer`` (:data:`CLIENT` or an agent hop), then a newline: one frame,
    or several joined by newlines (a run of notifications passed as it came)."""

    peer: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class Intercept:
    """Start handling an intercepted client request; answer it with :meth:`Router.answer`."""

    token: int
    frame: Frame


@dataclass(frozen=True, slots=True)
class Answered:
    """The answer to a request a waiter sent (:meth:`Router.forward` / :meth:`Router.request`)."""

    waiter: int
    frame: Frame


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The agent process a waiter's request went to is gone; ``status`` is its exit status."""

    waiter: int
    status: int | None


Event: TypeAlias = Intercept | Answered | Abandoned
# Returned when nothing happened beyond writing; callers only read it.
NO_EVENTS: Final[list[Event]] = []


@dataclass(slots=True)
class Interception:
    frame: Frame
    forwarded_as: tuple[int, RequestId] | None = None


def cancelled_request(message: JsonObject) -> JsonObject | None:
    """The params of a ``$/cancel_request`` that names a request; None for anything else.

    A cancel without a usable ``requestId`` is passed on as it came, never translated.
    """
    params = message.get("params")
    if (
        message["method"] == CANCEL_REQUEST
        and isinstance(params, dict)
        and "requestId" in params
        and is_request_id(params["requestId"])
    ):
        return params
    return None


MemberKind: TypeAlias = Kind | jsonrpc.FrameError
_MESSAGES: Final = (Kind.REQUEST, Kind.NOTIFICATION)  # the members that name a method
# What routing one client message decided: the hop, the message, whether it was changed.
Routed: TypeAlias = tuple[int, Any, bool]


def batch_refusal(
    members: Batch, kinds: list[MemberKind], intercepted: frozenset[str]
) -> list[JsonObject] | None:
    """The errors a client batch holding an intercepted method is answered with, or None
    if it holds none. Refused whole: answering part of it would split what the client sent
    as one. Every member that expects an answer gets one: each request, and each member
    that is not a message but names an id it can be answered under."""
    refused = [
        member
        for member, kind in zip(members, kinds, strict=True)
        if kind in _MESSAGES and member["method"] in intercepted
    ]
    if not refused:
        return None
    errors = []
    for member, kind in zip(members, kinds, strict=True):
        if not (
            isinstance(member, dict)
            and "id" in member
            and is_request_id(member["id"])
            and (kind is Kind.REQUEST or isinstance(kind, jsonrpc.FrameError))
        ):
            continue
        if isinstance(kind, jsonrpc.FrameError):
            reason = f"A batch member is not a JSON-RPC message: {kind.message}"
        elif member in refused:
            reason = f"The method {member['method']} must not be sent in a batch."
        else:
            reason = "The batch holds session requests, which must not be batched."
        errors.append(jsonrpc.error_response(member["id"], jsonrpc.INVALID_REQUEST, reason))
    return errors


def _member_kind(message: Any) -> MemberKind:
    """A batch member's kind by the rules of :func:`jsonrpc.classify_message`, or why it is
    not a JSON-RPC message (with its id when that could be read)."""
    if not isinstance(message, dict):
        return jsonrpc.FrameError(jsonrpc.INVALID_REQUEST, "A batch member is not an object.")
    try:
        return classify_message(message, b"").kind
    except jsonrpc.FrameError as exc:
        return exc


def _meant_as_answer(member: Any) -> bool:
    """Whether a batch member that is not JSON-RPC was meant as an answer: an id one can
    be, a ``result`` or an ``error``, no ``method``."""
    return (
        isinstance(member, dict)
        and "method" not in member
        and ("result" in member or "error" in member)
        and "id" in member
        and is_request_id(member["id"])
    )


class BatchParts:
    """What a batch becomes for each peer it goes to, as bytes: the members the router
    changed, and runs of members it did not, taken from the batch as they came (a span of
    its text each). No member's value is kept: a batch at the line limit costs about its
    own size again, not a value per member."""

    def __init__(self, batch: Batch) -> None:
        self._batch = batch
        self._parts: dict[int, list[tuple[int, int] | bytes]] = {}
        self._run: int | None = None  # the peer the member before went to, unchanged
        self.changed = False

    def keep(self, peer: int, start: int, end: int) -> None:
        """The member at ``text[start:end]`` goes to ``peer`` as it came."""
        parts = self._parts.setdefault(peer, [])
        if self._run == peer:
            run_start, _ = parts[-1]  # a run is a span
            parts[-1] = (run_start, end)  # the separators between them as they came
        else:
            parts.append((start, end))
        self._run = peer

    def replace(self, peer: int, raw: bytes) -> None:
        """A member goes to ``peer`` changed, as ``raw``."""
        self._parts.setdefault(peer, []).append(raw)
        self._run = None
        self.changed = True

    def drop(self) -> None:
        """A member goes nowhere (answered by the bridge, or dropped)."""
        self._run = None
        self.changed = True

    def frames(self) -> list[tuple[int, bytes]]:
        """The batch each peer gets: the one that arrived when it goes whole to one."""
        if not self.changed and len(self._parts) == 1:
            return [(peer, self._batch.raw) for peer in self._parts]
        frames = []
        for peer, parts in self._parts.items():
            out = bytearray(b"[")
            for index, part in enumerate(parts):
                if index:
                    out += b","
                out += part if isinstance(part, bytes) else self._batch.written(*part)
            out += b"]"
            frames.append((peer, bytes(out)))
        return frames


class Router:
    """Routes the frames of one client connection to and from its agent processes."""

    def __init__(self, *, intercepted: frozenset[str] = frozenset({INITIALIZE})) -> None:
        self._outgoing: list[Send] = []
        # Events of a call that returns none: a waiter told its answer was refused.
        self._events: list[Event] = []
        self.hops = Hops()
        """The agent processes, their requests in flight, and where each session lives."""
        self.intercepted = intercepted
        """Client methods handed to the runtime (:class:`Intercept`) instead of relayed."""
        self.authenticate_params: Any = None
        """The params of the client's last ``authenticate``, for a process started later."""
        self.gate = Gate()
        self._interceptions: dict[int, Interception] = {}
        self._tokens = itertools.count(1)
        # Client request id -> (hop, wire id): where it went, for $/cancel_request.
        self._client_inflight: dict[RequestId, tuple[int, RequestId]] = {}
        self.agent_requests = AgentRequests()
        """The agent requests sent to the client, by the ids the client knows them by."""
        self.answer_hold = AnswerHold()
        """Agent frames for the client waiting behind the bridge's answer to a request."""

    def configure(self, *, intercepted: frozenset[str]) -> None:
        """The client's ``initialize`` is answered: the client methods intercepted from now
        on."""
        self.intercepted = intercepted

    def data_to_send(self) -> list[Send]:
        """What the peers must be sent since the last call, in order; the caller writes it."""
        outgoing, self._outgoing = self._outgoing, []
        return outgoing

    def events_since(self) -> list[Event]:
        """Events of the calls that return none (:meth:`lose_client_request`) since the last
        time; the caller carries them out as it does those of the other calls."""
        if not self._events:
            return NO_EVENTS
        events, self._events = self._events, []
        return events

    def _send(self, peer: int, raw: bytes) -> None:
        self._outgoing.append(Send(peer, raw))

    # ------------------------------------------------------------------ hops

    def hop_closed(self, hop: int, status: int | None) -> list[Event]:
        """An agent process is gone: fail what was in flight on it."""
        state = self.hops.close(hop, status)
        events: list[Event] = []
        for origin in state.pending.drain():
            if isinstance(origin, FromClient):
                self._client_inflight.pop(origin.client_id, None)
                self.answer_error(
                    origin.client_id,
                    jsonrpc.INTERNAL_ERROR,
                    describe_exit(status),
                    {"exitStatus": status},
                )
            else:
                events.append(Abandoned(origin.waiter, status))
        self.agent_requests.drop_hop(hop)
        return events

    @property
    def intercepting(self) -> bool:
        """Whether an interception has not been answered yet."""
        return bool(self._interceptions)

    @property
    def settled(self) -> bool:
        """Whether every client frame received so far has been passed on (or answered)."""
        return not self.gate.waiting and all(
            interception.forwarded_as is not None for interception in self._interceptions.values()
        )

    # --------------------------------------------------------- from the client

    def receive_from_client(self, frame: Frame) -> list[Event]:
        if self.gate.active and not self.gate.admit(frame):
            return NO_EVENTS
        if (
            frame.kind is Kind.NOTIFICATION
            and len(self.hops) == 1
            and frame.message["method"] != CANCEL_REQUEST
        ):
            self._send(PRIMARY, frame.raw)
            return NO_EVENTS
        events: list[Event] = []
        self._dispatch_client(frame, events)
        return events

    def pass_notifications_from_client(
        self, lines: list[bytes], start: int
    ) -> tuple[int, Frame | None]:
        """Pass the run of plain notifications from ``lines[start]`` on to the agent, as
        one piece. The index of the first line not passed, for
        :meth:`receive_from_client`, with its frame if reading the run parsed it (see
        :func:`jsonrpc.plain_notifications`).

        The same rule as the first one of :meth:`receive_from_client`: with nothing held
        and one process, a notification other than ``$/cancel_request`` goes to it as it
        came.
        """
        if self.gate.active or len(self.hops) != 1:
            return start, None
        end, frame = jsonrpc.plain_notifications(lines, start)
        if end > start:
            self._send(PRIMARY, b"\n".join(lines[start:end]))
        return end, frame

    def _dispatch_client(self, frame: Frame, events: list[Event]) -> None:
        kind = frame.kind
        if kind is Kind.REQUEST:
            method = frame.method
            if method in self.intercepted and isinstance(frame.params, dict):
                self._intercept(frame, events)
                return
            if method == "authenticate":
                self.authenticate_params = frame.params
        if kind is Kind.BATCH:
            self._client_batch(frame)
            return
        routed = self._route_client(kind, frame.message)
        if routed is not None:
            hop, message, changed = routed
            self._send(hop, jsonrpc.encode(message) if changed else frame.raw)

    def _route_client(self, kind: Kind, message: JsonObject) -> Routed | None:
        """Take one client message into the tables; None: answered or dropped."""
        if kind is Kind.REQUEST:
            return self._client_request(message)
        if kind is Kind.NOTIFICATION:
            return self._client_notification(message)
        return self._client_response(message)

    def _client_request(self, message: JsonObject) -> Routed | None:
        client_id = message["id"]
        hop = self.hops.hop_for(message)
        state = self.hops[hop]
        if state.closed:
            self.answer_error(
                client_id,
                jsonrpc.INTERNAL_ERROR,
                describe_exit(state.status),
                {"exitStatus": state.status},
            )
            return None
        wire_id = state.pending.register(client_id, FromClient(client_id))
        self._client_inflight[client_id] = (hop, wire_id)
        if wire_id == client_id:
            return hop, message, False
        return hop, {**message, "id": wire_id}, True

    def _client_notification(self, message: JsonObject) -> Routed:
        params = cancelled_request(message)
        if params is not None:
            target = self._client_inflight.get(params["requestId"])
            if target is not None:
                hop, wire_id = target
                if wire_id == params["requestId"]:
                    return hop, message, False
                return hop, {**message, "params": {**params, "requestId": wire_id}}, True
        return self.hops.hop_for(message), message, False

    def _client_response(self, message: JsonObject) -> Routed | None:
        target = self.agent_requests.resolve(message["id"])
        if target is None:
            log.debug(
                "the client answered an unknown request %r; passed to the agent", message["id"]
            )
            return PRIMARY, message, False
        hop, agent_id = target
        if self.hops[hop].closed:
            log.debug("dropped the client's answer to a request of an agent process that is gone")
            return None
        if agent_id == message["id"]:
            return hop, message, False
        return hop, {**message, "id": agent_id}, True

    def _client_batch(self, frame: Frame) -> None:
        batch: Batch = frame.message
        kinds = []
        intercepted = False
        for member in batch:
            kind = _member_kind(member)
            kinds.append(kind)
            if kind in _MESSAGES and member["method"] in self.intercepted:
                intercepted = True
        if intercepted:
            errors = batch_refusal(batch, kinds, self.intercepted)
            if errors:
                self._send(CLIENT, jsonrpc.encode(errors))
            return
        parts = BatchParts(batch)
        for (member, start, end), kind in zip(batch.spans(), kinds, strict=True):
            if isinstance(kind, jsonrpc.FrameError):
                # The bridge answers a malformed member itself (under its id when it has a
                # readable one): nothing but JSON-RPC reaches the agent, and the batch's
                # other members still go.
                self.answer_error(
                    kind.request_id,
                    jsonrpc.INVALID_REQUEST,
                    f"A batch member is not a JSON-RPC message: {kind.message}",
                )
                routed = None
            else:
                routed = self._route_client(kind, member)
            if routed is None:
                parts.drop()
                continue
            hop, message, member_changed = routed
            if member_changed:
                parts.replace(hop, jsonrpc.encode(message))
            else:
                parts.keep(hop, start, end)
        for hop, raw in parts.frames():
            self._send(hop, raw)

    def answer_error(
        self, request_id: RequestId, code: int, message: str, data: Any = None
    ) -> None:
        """Queue an error answer to the client's request ``request_id``."""
        self._send(CLIENT, jsonrpc.encode(jsonrpc.error_response(request_id, code, message, data)))

    # ------------------------------------- lines passed on by the runtime as they came

    def record_from_client(self, kind: Kind, message: JsonObject) -> tuple[int, bool] | None:
        """Take a client message whose bytes the runtime passes on itself (a long line,
        :mod:`acp_bridge.core.long_lines`) into the tables as if it had come whole: the
        hop it goes to and whether the router would change it; None: answered or dropped."""
        routed = self._route_client(kind, message)
        return None if routed is None else (routed[0], routed[2])

    def record_from_agent(self, hop: int, kind: Kind, message: JsonObject) -> bool | None:
        """The same for an agent message: whether the router would change it; None:
        dropped (an answer to no pending request)."""
        routed = self._route_agent(hop, kind, message, None, [])
        return None if routed is None else routed[1]

    def lose_client_request(self, hop: int, wire_id: Any, message: str) -> None:
        """The answer to request ``wire_id`` on ``hop`` will not reach its asker (the
        agent's line could not be passed on): if a client request or a waiter waits for it,
        it gets ``message`` as the error, so that it does not wait for ever."""
        origin = self.hops[hop].pending.get(wire_id)
        if origin is None:
            return
        self.hops[hop].pending.resolve(wire_id)
        if isinstance(origin, ForWaiter):
            # An intercepted request, or the bridge's own: its waiter gets the error as the
            # agent's answer (and the client, through the interception, its own).
            error = jsonrpc.error_response(wire_id, jsonrpc.INTERNAL_ERROR, message)
            self._events.append(Answered(origin.waiter, classify_message(error)))
            return
        if self._client_inflight.get(origin.client_id) == (hop, wire_id):
            del self._client_inflight[origin.client_id]
        self.answer_error(origin.client_id, jsonrpc.INTERNAL_ERROR, message)

    # ------------------------------------------------------------ interceptions

    def _intercept(self, frame: Frame, events: list[Event]) -> None:
        token = next(self._tokens)
        self.gate.hold_for(frame, token)
        self._interceptions[token] = Interception(frame)
        events.append(Intercept(token, frame))

    def forward(
        self, token: int, hop: int, message: JsonObject | None = None
    ) -> tuple[int | None, list[Event]]:
        """Send an intercepted request to ``hop``, as received or as ``message``.

        Returns the waiter whose :class:`Answered` event carries the agent's answer (None:
        the process is gone), and the events of the frames this lets go.
        """
        interception = self._interceptions[token]
        frame = interception.frame
        state = self.hops[hop]
        if state.closed:
            return None, []
        waiter = next(self._tokens)
        wire_id = state.pending.register(frame.id, ForWaiter(waiter))
        interception.forwarded_as = (hop, wire_id)
        self._client_inflight[frame.id] = (hop, wire_id)
        if message is None and wire_id == frame.id:
            self._send(hop, frame.raw)
        else:
            self._send(hop, jsonrpc.encode({**(message or frame.message), "id": wire_id}))
        self.gate.forwarded(token)
        return waiter, self._release()

    def answer(self, token: int, raw: bytes) -> list[Event]:
        """The interception is over: send the client its answer and let waiting frames go."""
        interception = self._interceptions.pop(token)
        client_id = interception.frame.id
        if (
            interception.forwarded_as is not None
            and self._client_inflight.get(client_id) == interception.forwarded_as
        ):
            del self._client_inflight[client_id]
        self._send(CLIENT, raw)
        for held in self.answer_hold.answered(token):
            self._send(CLIENT, held)
        self.gate.answered(token)
        return self._release()

    def _to_client(self, hop: int, raw: bytes, message: Any) -> None:
        """Send the client a frame of agent process ``hop``, unless it must wait."""
        if self.answer_hold.admit(hop, raw, message):
            self._send(CLIENT, raw)

    def _release(self) -> list[Event]:
        events: list[Event] = []
        for frame in self.gate.releasable():
            self._dispatch_client(frame, events)
        return events

    # --------------------------------------------------- the bridge's own requests

    def request(self, hop: int, method: str, params: Any) -> int | None:
        """Send a request of the bridge's own; the waiter of its answer (None: hop gone)."""
        state = self.hops[hop]
        if state.closed:
            return None
        waiter = next(self._tokens)
        wire_id = state.pending.register(state.pending.fresh_id(), ForWaiter(waiter))
        self._send(hop, jsonrpc.encode(jsonrpc.request(wire_id, method, params)))
        return waiter

    def notify(self, hop: int, method: str, params: Any) -> None:
        if not self.hops[hop].closed:
            self._send(hop, jsonrpc.encode(jsonrpc.notification(method, params)))

    # ---------------------------------------------------------- from an agent

    def receive_from_agent(self, hop: int, frame: Frame) -> list[Event]:
        kind = frame.kind
        if kind is Kind.NOTIFICATION and frame.message["method"] != CANCEL_REQUEST:
            # The bulk of the traffic (session/update): nothing to translate.
            self._to_client(hop, frame.raw, frame.message)
            return NO_EVENTS
        events: list[Event] = []
        if kind is Kind.BATCH:
            self._agent_batch(hop, frame, events)
            return events
        routed = self._route_agent(hop, kind, frame.message, frame, events)
        if routed is not None:
            message, changed = routed
            self._to_client(hop, jsonrpc.encode(message) if changed else frame.raw, message)
        return events

    def pass_notifications_from_agent(
        self, lines: list[bytes], start: int
    ) -> tuple[int, Frame | None]:
        """Pass the run of plain notifications from ``lines[start]`` on to the client, as
        one piece; the index of the first line not passed, for :meth:`receive_from_agent`,
        with its frame if reading the run parsed it.

        The same rule as the first one of :meth:`receive_from_agent`, for any process.
        """
        if self.answer_hold.holding():
            return start, None  # line by line: some must wait behind an answer
        end, frame = jsonrpc.plain_notifications(lines, start)
        if end > start:
            self._send(CLIENT, b"\n".join(lines[start:end]))
        return end, frame

    def _route_agent(
        self, hop: int, kind: Kind, message: JsonObject, frame: Frame | None, events: list[Event]
    ) -> tuple[Any, bool] | None:
        """Take one agent message into the tables: it, and whether it was changed; None:
        dropped (an answer to no request, or one the bridge waited for)."""
        if kind is Kind.NOTIFICATION:
            return self._agent_notification(hop, message)
        if kind is Kind.RESPONSE:
            return self._agent_response(hop, message, frame, events)
        return self._agent_request(hop, message)

    def _agent_notification(self, hop: int, message: JsonObject) -> tuple[Any, bool]:
        params = cancelled_request(message)
        if params is not None:
            client_id = self.agent_requests.client_id(hop, params["requestId"])
            if client_id != params["requestId"]:
                return {**message, "params": {**params, "requestId": client_id}}, True
        return message, False

    def _agent_response(
        self, hop: int, message: JsonObject, frame: Frame | None, events: list[Event]
    ) -> tuple[Any, bool] | None:
        wire_id = message["id"]
        origin = self.hops[hop].pending.resolve(wire_id)
        if origin is None:
            # A second answer to one request, or an answer to none: the client would get
            # an answer it cannot match, or a second one for a request already settled.
            log.warning(
                "agent hop %d answered id %r, for which no request is pending; dropped",
                hop,
                wire_id,
            )
            return None
        if isinstance(origin, ForWaiter):
            events.append(Answered(origin.waiter, frame or classify_message(message)))
            for token, interception in self._interceptions.items():
                if interception.forwarded_as == (hop, wire_id):
                    self.answer_hold.hold(token, hop, interception.frame, message)
            return None
        client_id = origin.client_id
        if self._client_inflight.get(client_id) == (hop, wire_id):
            del self._client_inflight[client_id]
        if client_id == wire_id:
            return message, False
        return {**message, "id": client_id}, True

    def _agent_request(self, hop: int, message: JsonObject) -> tuple[Any, bool]:
        agent_id = message["id"]
        client_id = self.agent_requests.register(hop, agent_id)
        if client_id == agent_id:
            return message, False
        return {**message, "id": client_id}, True

    def _agent_batch(self, hop: int, frame: Frame, events: list[Event]) -> None:
        batch: Batch = frame.message
        parts = BatchParts(batch)
        for member, start, end in batch.spans():
            kind = _member_kind(member)
            if isinstance(kind, jsonrpc.FrameError):
                log.warning(
                    "agent hop %d: dropped a batch member that is not JSON-RPC: %s",
                    hop,
                    kind.message,
                )
                if _meant_as_answer(member):  # its asker must not wait for ever
                    self.lose_client_request(hop, member["id"], AGENT_ANSWER_REFUSED)
                routed = None
            else:
                routed = self._route_agent(hop, kind, member, None, events)
            if routed is None:
                parts.drop()
            elif routed[1]:
                parts.replace(CLIENT, jsonrpc.encode(routed[0]))
            else:
                parts.keep(CLIENT, start, end)
        for _, raw in parts.frames():
            # What the client may have to wait for is named in the batch as it came (a
            # member taken out names no session).
            self._to_client(hop, raw, batch)
