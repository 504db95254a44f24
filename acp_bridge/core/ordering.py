"""Per-session order while an interception is in progress (spec §2).

While the bridge works on an intercepted client request, only the client frames that must
follow it wait: frames naming the same session, or cancelling that very request. Everything
else keeps flowing. The rules:

* ``initialize`` holds the whole connection until it is answered: the adapter is chosen
  from its answer, and nothing may slip past validation before that.
* A lifecycle request (``session/new`` … ``session/delete``) holds its session until it is
  answered: what follows a ``session/load`` must see where the session now lives.
* An intercepted ``session/prompt`` holds its session only until it has been forwarded: a
  turn may run for minutes, and the client's ``session/cancel`` must reach it.
* Cancels (``session/cancel`` of the session, ``$/cancel_request`` of the request) wait only
  until the held request has been forwarded, so they can never overtake it.
* Frames that wait keep their order among themselves, per key.

The other direction has the mirror rule (:class:`AnswerHold`): once an agent process has
answered an intercepted request whose client answer the bridge is still making (the hook
runs on, the session is being recorded), what that process sends the client about the same
session (for ``session/new`` and ``session/fork``, the session its answer names) waits
until the bridge's answer has been sent, so it cannot overtake it; after ``initialize``,
everything that process sends waits.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from acp_bridge.wire.jsonrpc import CANCEL_REQUEST, Frame, Kind, RequestId, is_request_id

# The key that stands for the whole connection.
CONNECTION: Final = ("connection",)

Key: TypeAlias = tuple[Any, ...]

SESSION_CANCEL: Final = "session/cancel"
INITIALIZE: Final = "initialize"
SESSION_PROMPT: Final = "session/prompt"


def session_key(session_id: str) -> Key:
    return ("session", session_id)


def request_key(request_id: RequestId) -> Key:
    return ("request", request_id)


@dataclass(slots=True)
class Hold:
    token: int
    until_answered: bool
    forwarded: bool = False


def _message_keys(message: Any) -> tuple[list[Key], bool]:
    """The keys one message names, and whether it is a cancel."""
    if not isinstance(message, dict) or "method" not in message:
        return [], False
    params = message.get("params")
    if not isinstance(params, dict):
        return [], False
    method = message.get("method")
    if method == CANCEL_REQUEST:
        if "requestId" in params and is_request_id(params["requestId"]):
            return [request_key(params["requestId"])], True
        return [], True
    session_id = params.get("sessionId")
    if isinstance(session_id, str):
        return [session_key(session_id)], method == SESSION_CANCEL
    return [], False


def frame_keys(frame: Frame) -> tuple[list[Key], bool]:
    """The keys a client frame names (sessions, a cancelled request) and whether it cancels."""
    if frame.kind is Kind.BATCH:
        keys: list[Key] = []
        for member in frame.message:
            keys.extend(_message_keys(member)[0])
        return keys, False
    return _message_keys(frame.message)


class Gate:
    """Which client frames wait behind interceptions, and in what order they are let go."""

    def __init__(self) -> None:
        self._holds: dict[Key, Hold] = {}
        self._waiting: deque[tuple[Frame, list[Key], bool]] = deque()
        self.active = False
        """Whether any frame could be held now (kept up to date, read on every frame)."""
        self.waiting_bytes = 0
        """How many bytes the frames that wait arrived as."""

    def _update(self) -> None:
        self.active = bool(self._holds) or bool(self._waiting)

    @property
    def waiting(self) -> int:
        """How many frames wait."""
        return len(self._waiting)

    def hold(self, keys: list[Key], token: int, *, until_answered: bool) -> None:
        for key in keys:
            self._holds[key] = Hold(token, until_answered)
        self._update()

    def hold_for(self, request: Frame, token: int) -> None:
        """An intercepted client request (interception ``token``) holds what it names: the
        whole connection for ``initialize``, else its id and its session; until answered,
        but for ``session/prompt`` only until forwarded."""
        keys: list[Key]
        if request.method == INITIALIZE:
            keys = [CONNECTION]
        else:
            keys = [request_key(request.id)]
            session_id = request.params.get("sessionId")
            if isinstance(session_id, str):
                keys.append(session_key(session_id))
        self.hold(keys, token, until_answered=request.method != SESSION_PROMPT)

    def admit(self, frame: Frame) -> bool:
        """Whether ``frame`` may be processed now; if not, it is kept until :meth:`release`."""
        keys, cancels = frame_keys(frame)
        if self._blocked(keys, cancels, len(self._waiting)):
            self._waiting.append((frame, keys, cancels))
            self.waiting_bytes += len(frame.raw)
            self._update()
            return False
        return True

    def forwarded(self, token: int) -> None:
        for hold in self._holds.values():
            if hold.token == token:
                hold.forwarded = True

    def answered(self, token: int) -> None:
        for key in [key for key, hold in self._holds.items() if hold.token == token]:
            del self._holds[key]
        self._update()

    def release(self) -> Frame | None:
        """The first waiting frame that may go now, taken out of the queue (or None)."""
        for index, (frame, keys, cancels) in enumerate(self._waiting):
            if not self._blocked(keys, cancels, index):
                del self._waiting[index]
                self.waiting_bytes -= len(frame.raw)
                self._update()
                return frame
        return None

    def _blocked(self, keys: list[Key], cancels: bool, position: int) -> bool:
        if CONNECTION in self._holds:
            return True
        for key in keys:
            hold = self._holds.get(key)
            if hold is not None and (not hold.forwarded or (hold.until_answered and not cancels)):
                return True
        if not keys and position == 0:
            return False
        # Frames that wait keep their order: nothing overtakes an earlier frame of its key,
        # and a frame naming no key does not overtake one that waits for the connection.
        for index, (_, earlier, _) in enumerate(self._waiting):
            if index >= position:
                break
            if not earlier or any(key in earlier for key in keys):
                return True
        return False


class AnswerHold:
    """Which agent frames for the client wait behind the bridge's answer to an intercepted
    request the agent has already answered (the mirror rule above), and when they go."""

    def __init__(self) -> None:
        # Interception token -> (the hop that answered, the sessions its frames wait for;
        # None: all of them).
        self._pending: dict[int, tuple[int, frozenset[str] | None]] = {}
        self._held: dict[int, list[bytes]] = {}  # hop -> frames for the client, in order

    def hold(self, token: int, hop: int, request: Frame, answer: Any) -> None:
        """Process ``hop`` answered intercepted ``request``: hold what must not overtake
        the bridge's answer."""
        sessions: frozenset[str] | None = None
        if request.method != INITIALIZE:
            named = [request.params.get("sessionId")]
            result = answer.get("result") if isinstance(answer, dict) else None
            if isinstance(result, dict):
                named.append(result.get("sessionId"))
            sessions = frozenset(name for name in named if isinstance(name, str))
            if not sessions:
                return
        self._pending[token] = (hop, sessions)
        self._held.setdefault(hop, [])

    def holding(self, hop: int | None = None) -> bool:
        """Whether frames of ``hop`` (of any process: None) may have to wait now."""
        return bool(self._held) if hop is None else hop in self._held

    def admit(self, hop: int, raw: bytes, message: Any) -> bool:
        """Whether a frame of ``hop`` for the client may go now; if not, it is kept."""
        held = self._held.get(hop)
        if held is None or not self._must_wait(hop, message):
            return True
        held.append(raw)
        return False

    def answered(self, token: int) -> list[bytes]:
        """The bridge's answer for ``token`` is sent: the frames that follow it now."""
        pending = self._pending.pop(token, None)
        if pending is None or any(hop == pending[0] for hop, _ in self._pending.values()):
            return []
        return self._held.pop(pending[0], [])

    def _must_wait(self, hop: int, message: Any) -> bool:
        for pending_hop, sessions in self._pending.values():
            if pending_hop != hop:
                continue
            if sessions is None:
                return True
            for member in [message] if isinstance(message, dict) else message:
                params = member.get("params") if isinstance(member, dict) else None
                named = params.get("sessionId") if isinstance(params, dict) else None
                if isinstance(named, str) and named in sessions:
                    return True
        return False
