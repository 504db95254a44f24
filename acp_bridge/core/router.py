"""The router: where each frame goes, under which id, and when.

:class:`Router` is the bridge's protocol state for one client connection and its agent
connections ("hops"; hop 0 is the primary agent process). It owns

* the pending-request table of every hop (:mod:`acp_bridge.core.pending`), for single
  messages and batch members alike, in both directions;
* the client-facing ids of requests the agents send to the client, and the translation of
  ``$/cancel_request`` both ways (a cancel without ``requestId`` passes as it came);
* the order of client frames while interceptions are in progress
  (:mod:`acp_bridge.core.ordering`).

It does no I/O and calls nothing it is not made with. Like h11's connection it owns its
output: the bytes each peer must get queue in the router, in the order the peer must
receive them, until the runtime takes them (:meth:`Router.data_to_send`, a list of
:class:`Send`); a frame the router does not change is passed as the very bytes it arrived
as. What the runtime must do besides writing is returned by the call that caused it, as
events: start an interception (:class:`Intercept`), hand an answer to a waiter
(:class:`Answered`), or tell a waiter its request is lost with the agent process
(:class:`Abandoned`).

Its configuration comes in through :meth:`Router.configure` once the client's
``initialize`` is answered: which client methods are intercepted. Where a session lives
while more than one agent process runs is a table the router owns, filled with values
(:meth:`Router.place`, :meth:`Router.unplace`, as the adapter says through its context):
routing a frame is a lookup in it, never a call out.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from acp_bridge.core.exits import describe_exit
from acp_bridge.core.ordering import CONNECTION, Gate, Key, request_key, session_key
from acp_bridge.core.pending import ForWaiter, FromClient, PendingTable
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.json_stream import Envelope
from acp_bridge.wire.jsonrpc import (
    CANCEL_REQUEST,
    Frame,
    JsonObject,
    Kind,
    RequestId,
    classify_message,
    is_request_id,
)

log = logging.getLogger("acp_bridge.router")

CLIENT: Final = -1
PRIMARY: Final = 0

INITIALIZE: Final = "initialize"
# Intercepted session/prompt holds its session only until forwarded (see ordering).
SESSION_PROMPT: Final = "session/prompt"


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
class Hop:
    """One agent connection: its requests in flight, and whether it is gone."""

    pending: PendingTable = field(default_factory=PendingTable)
    closed: bool = False
    status: int | None = None


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


def _member_kind(message: Any) -> Kind | jsonrpc.FrameError:
    """A batch member's kind by the rules of :func:`jsonrpc.classify_message`, or why it is
    not a JSON-RPC message (with its id when that could be read)."""
    if not isinstance(message, dict):
        return jsonrpc.FrameError(jsonrpc.INVALID_REQUEST, "A batch member is not an object.")
    try:
        return classify_message(message, b"").kind
    except jsonrpc.FrameError as exc:
        return exc


class Router:
    """Routes the frames of one client connection to and from its agent processes."""

    def __init__(self, *, intercepted: frozenset[str] = frozenset({INITIALIZE})) -> None:
        self._outgoing: list[Send] = []
        self.hops: dict[int, Hop] = {PRIMARY: Hop()}
        self.intercepted = intercepted
        """Client methods handed to the runtime (:class:`Intercept`) instead of relayed."""
        # Session id -> the hop it lives in, for sessions not in the primary.
        self._placed: dict[str, int] = {}
        self.authenticate_params: Any = None
        """The params of the client's last ``authenticate``, for a process started later."""
        self.gate = Gate()
        self._interceptions: dict[int, Interception] = {}
        self._tokens = itertools.count(1)
        # Client request id -> (hop, wire id): where it went, for $/cancel_request.
        self._client_inflight: dict[RequestId, tuple[int, RequestId]] = {}
        # Agent requests to the client: client-facing id -> (hop, the agent's id), and back.
        self._agent_requests: dict[RequestId, tuple[int, RequestId]] = {}
        self._agent_request_ids: dict[tuple[int, RequestId], RequestId] = {}
        self._client_facing = PendingTable()
        # An agent answered an intercepted request whose client answer the runtime is still
        # making (the hook runs on, the session is being recorded): what that process sends
        # the client meanwhile about the same session waits, so it cannot overtake the
        # answer (spec §2, order); after initialize, everything it sends waits.
        self._answer_pending: dict[int, tuple[int, frozenset[str] | None]] = {}
        self._held: dict[int, list[bytes]] = {}  # hop -> frames for the client, in order

    def configure(self, *, intercepted: frozenset[str]) -> None:
        """The client's ``initialize`` is answered: the client methods intercepted from now
        on."""
        self.intercepted = intercepted

    def data_to_send(self) -> list[Send]:
        """What the peers must be sent since the last call, in order; the caller writes it."""
        outgoing, self._outgoing = self._outgoing, []
        return outgoing

    def _send(self, peer: int, raw: bytes) -> None:
        self._outgoing.append(Send(peer, raw))

    # ------------------------------------------------------------------ hops

    def place(self, session_id: str, hop: int) -> None:
        """Session ``session_id`` lives in agent process ``hop`` from now on: the client's
        frames naming it go there."""
        if hop == PRIMARY:
            self._placed.pop(session_id, None)
        else:
            self._placed[session_id] = hop

    def unplace(self, session_id: str) -> None:
        """Session ``session_id`` is gone (closed, deleted): its frames go to the primary."""
        self._placed.pop(session_id, None)

    def add_hop(self) -> int:
        """A new agent process joins the connection; its hop number."""
        hop = max(self.hops) + 1
        self.hops[hop] = Hop()
        return hop

    def hop_closed(self, hop: int, status: int | None) -> list[Event]:
        """An agent process is gone: fail what was in flight on it."""
        state = self.hops[hop]
        state.closed = True
        state.status = status
        self._placed = {name: at for name, at in self._placed.items() if at != hop}
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
        for client_id, (owner, agent_id) in list(self._agent_requests.items()):
            if owner == hop:
                del self._agent_requests[client_id]
                self._client_facing.resolve(client_id)
                self._agent_request_ids.pop((hop, agent_id), None)
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
            self._send_member(self._client_request(frame.message), frame.raw)
        elif kind is Kind.NOTIFICATION:
            self._send_member(self._client_notification(frame.message), frame.raw)
        elif kind is Kind.RESPONSE:
            self._send_member(self._client_response(frame.message), frame.raw)
        else:
            self._client_batch(frame)

    def _send_member(self, routed: tuple[int, Any, bool] | None, raw: bytes) -> None:
        if routed is not None:
            hop, message, changed = routed
            self._send(hop, jsonrpc.encode(message) if changed else raw)

    def hop_for(self, message: JsonObject) -> int:
        """The hop a client message goes to: the one its session was placed in, else (or
        when that process is gone) the primary."""
        if not self._placed:
            return PRIMARY
        params = message.get("params")
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        hop = self._placed.get(session_id) if isinstance(session_id, str) else None
        if hop is None or self.hops[hop].closed:
            return PRIMARY
        return hop

    def _client_request(self, message: JsonObject) -> tuple[int, Any, bool] | None:
        client_id = message["id"]
        hop = self.hop_for(message)
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

    def _client_notification(self, message: JsonObject) -> tuple[int, Any, bool] | None:
        params = cancelled_request(message)
        if params is not None:
            target = self._client_inflight.get(params["requestId"])
            if target is not None:
                hop, wire_id = target
                if wire_id == params["requestId"]:
                    return hop, message, False
                return hop, {**message, "params": {**params, "requestId": wire_id}}, True
        return self.hop_for(message), message, False

    def _client_response(self, message: JsonObject) -> tuple[int, Any, bool] | None:
        target = self._agent_requests.pop(message["id"], None)
        if target is None:
            log.debug(
                "the client answered an unknown request %r; passed to the agent", message["id"]
            )
            return PRIMARY, message, False
        self._client_facing.resolve(message["id"])
        hop, agent_id = target
        self._agent_request_ids.pop((hop, agent_id), None)
        if self.hops[hop].closed:
            log.debug("dropped the client's answer to a request of an agent process that is gone")
            return None
        if agent_id == message["id"]:
            return hop, message, False
        return hop, {**message, "id": agent_id}, True

    def _client_batch(self, frame: Frame) -> None:
        members: list[Any] = frame.message
        kinds = [_member_kind(member) for member in members]
        intercepted = [
            member
            for member, kind in zip(members, kinds, strict=True)
            if kind in (Kind.REQUEST, Kind.NOTIFICATION) and member["method"] in self.intercepted
        ]
        if intercepted:
            # Refused whole: answering part of it would split what the client sent as one.
            # Every member that expects an answer gets one: each request, and each member
            # that is not a message but names an id it can be answered under.
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
                elif member in intercepted:
                    reason = f"The method {member['method']} must not be sent in a batch."
                else:
                    reason = "The batch holds session requests, which must not be batched."
                errors.append(jsonrpc.error_response(member["id"], jsonrpc.INVALID_REQUEST, reason))
            if errors:
                self._send(CLIENT, jsonrpc.encode(errors))
            return
        groups: dict[int, list[Any]] = {}
        changed = False
        for member, kind in zip(members, kinds, strict=True):
            routed: tuple[int, Any, bool] | None
            if kind is Kind.REQUEST:
                routed = self._client_request(member)
            elif kind is Kind.NOTIFICATION:
                routed = self._client_notification(member)
            elif kind is Kind.RESPONSE:
                routed = self._client_response(member)
            else:
                # The bridge answers a malformed member itself (under its id when it has a
                # readable one): nothing but JSON-RPC reaches the agent, and the batch's
                # other members still go.
                assert isinstance(kind, jsonrpc.FrameError)
                self.answer_error(
                    kind.request_id,
                    jsonrpc.INVALID_REQUEST,
                    f"A batch member is not a JSON-RPC message: {kind.message}",
                )
                routed = None
            if routed is None:
                changed = True
                continue
            hop, message, member_changed = routed
            changed = changed or member_changed
            groups.setdefault(hop, []).append(message)
        if not changed and len(groups) == 1:
            (hop,) = groups
            self._send(hop, frame.raw)
            return
        for hop, group in groups.items():
            self._send(hop, jsonrpc.encode(group))

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
        if kind is Kind.REQUEST:
            routed = self._client_request(message)
        elif kind is Kind.NOTIFICATION:
            routed = self._client_notification(message)
        else:
            routed = self._client_response(message)
        return None if routed is None else (routed[0], routed[2])

    def record_from_agent(self, hop: int, kind: Kind, message: JsonObject) -> bool | None:
        """The same for an agent message: whether the router would change it; None:
        dropped (an answer to no pending request)."""
        routed: tuple[Any, bool] | None
        if kind is Kind.RESPONSE:
            routed = self._agent_response(hop, message, None, [])
        elif kind is Kind.REQUEST:
            routed = self._agent_request(hop, message)
        else:
            routed = self._agent_notification(hop, message)
        return None if routed is None else routed[1]

    def agent_request(self, client_id: Any) -> tuple[int, RequestId] | None:
        """The hop and own id of the agent request the client knows as ``client_id``."""
        return self._agent_requests.get(client_id)

    def is_client_facing(self, request_id: Any) -> bool:
        """Whether ``request_id`` names an agent request the client has been sent."""
        return request_id in self._client_facing

    def answers_client(self, hop: int, wire_id: Any) -> bool:
        """Whether ``wire_id`` on ``hop`` is a client request, pending under its own id."""
        return self.hops[hop].pending.get(wire_id) == FromClient(wire_id)

    def holding_for_client(self, hop: int) -> bool:
        """Whether frames of ``hop`` for the client may have to wait behind an answer."""
        return hop in self._held

    def agent_line_refused(
        self,
        hop: int,
        envelope: Envelope,
        message: str = AGENT_ANSWER_REFUSED,
    ) -> None:
        """An agent line was not passed on (not valid JSON-RPC, or beyond what the bridge
        reads), or was cut after its start went on. If it was the answer to a client
        request (as far as it was read), the client gets ``message`` as the error, so that
        it does not wait for ever."""
        members = envelope.members
        if "method" in members or ("result" not in members and "error" not in members):
            return
        wire_id = members.get("id")
        if not is_request_id(wire_id):
            return
        origin = self.hops[hop].pending.get(wire_id)
        if not isinstance(origin, FromClient):
            return  # none, or a waiter's (it hears when the process goes)
        self.hops[hop].pending.resolve(wire_id)
        if self._client_inflight.get(origin.client_id) == (hop, wire_id):
            del self._client_inflight[origin.client_id]
        self.answer_error(origin.client_id, jsonrpc.INTERNAL_ERROR, message)

    # ------------------------------------------------------------ interceptions

    def _intercept(self, frame: Frame, events: list[Event]) -> None:
        token = next(self._tokens)
        method = frame.method
        keys: list[Key]
        if method == INITIALIZE:
            keys = [CONNECTION]
        else:
            keys = [request_key(frame.id)]
            session_id = frame.params.get("sessionId")
            if isinstance(session_id, str):
                keys.append(session_key(session_id))
        self.gate.hold(keys, token, until_answered=method != SESSION_PROMPT)
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
        pending = self._answer_pending.pop(token, None)
        if pending is not None and all(
            hop != pending[0] for hop, _ in self._answer_pending.values()
        ):
            for held in self._held.pop(pending[0], []):
                self._send(CLIENT, held)
        self.gate.answered(token)
        return self._release()

    def _hold_after_answer(self, token: int, hop: int, answer: JsonObject) -> None:
        """The agent answered interception ``token``: hold what must not overtake it."""
        frame = self._interceptions[token].frame
        sessions: frozenset[str] | None = None  # None: everything (initialize)
        if frame.method != INITIALIZE:
            named = [frame.params.get("sessionId")]
            result = answer.get("result")
            if isinstance(result, dict):
                named.append(result.get("sessionId"))
            sessions = frozenset(name for name in named if isinstance(name, str))
            if not sessions:
                return
        self._answer_pending[token] = (hop, sessions)
        self._held.setdefault(hop, [])

    def _to_client(self, hop: int, raw: bytes, message: Any) -> None:
        """Send the client a frame of agent process ``hop``, unless it must wait (above)."""
        held = self._held.get(hop)
        if held is not None and self._must_wait(hop, message):
            held.append(raw)
        else:
            self._send(CLIENT, raw)

    def _must_wait(self, hop: int, message: Any) -> bool:
        for pending_hop, sessions in self._answer_pending.values():
            if pending_hop != hop:
                continue
            if sessions is None:
                return True
            for member in message if isinstance(message, list) else [message]:
                params = member.get("params") if isinstance(member, dict) else None
                named = params.get("sessionId") if isinstance(params, dict) else None
                if isinstance(named, str) and named in sessions:
                    return True
        return False

    def _release(self) -> list[Event]:
        events: list[Event] = []
        while (frame := self.gate.release()) is not None:
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
        routed: tuple[Any, bool] | None
        if kind is Kind.NOTIFICATION:
            routed = self._agent_notification(hop, frame.message)
        elif kind is Kind.RESPONSE:
            routed = self._agent_response(hop, frame.message, frame, events)
        elif kind is Kind.REQUEST:
            routed = self._agent_request(hop, frame.message)
        else:
            self._agent_batch(hop, frame, events)
            return events
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
        if self._held:
            return start, None  # line by line: some must wait behind an answer
        end, frame = jsonrpc.plain_notifications(lines, start)
        if end > start:
            self._send(CLIENT, b"\n".join(lines[start:end]))
        return end, frame

    def _agent_notification(self, hop: int, message: JsonObject) -> tuple[Any, bool]:
        params = cancelled_request(message)
        if params is not None:
            client_id = self._agent_request_ids.get((hop, params["requestId"]), params["requestId"])
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
                    self._hold_after_answer(token, hop, message)
            return None
        client_id = origin.client_id
        if self._client_inflight.get(client_id) == (hop, wire_id):
            del self._client_inflight[client_id]
        if client_id == wire_id:
            return message, False
        return {**message, "id": client_id}, True

    def _agent_request(self, hop: int, message: JsonObject) -> tuple[Any, bool]:
        agent_id = message["id"]
        client_id = self._client_facing.register(agent_id, FromClient(agent_id))
        self._agent_requests[client_id] = (hop, agent_id)
        self._agent_request_ids[(hop, agent_id)] = client_id
        if client_id == agent_id:
            return message, False
        return {**message, "id": client_id}, True

    def _agent_batch(self, hop: int, frame: Frame, events: list[Event]) -> None:
        kept: list[Any] = []
        changed = False
        for member in frame.message:
            kind = _member_kind(member)
            routed: tuple[Any, bool] | None
            if kind is Kind.NOTIFICATION:
                routed = self._agent_notification(hop, member)
            elif kind is Kind.RESPONSE:
                routed = self._agent_response(hop, member, None, events)
            elif kind is Kind.REQUEST:
                routed = self._agent_request(hop, member)
            else:
                log.warning("agent hop %d: dropped a batch member that is not JSON-RPC", hop)
                routed = None
            if routed is None:
                changed = True
                continue
            message, member_changed = routed
            changed = changed or member_changed
            kept.append(message)
        if not kept:
            return
        self._to_client(hop, jsonrpc.encode(kept) if changed else frame.raw, kept)
