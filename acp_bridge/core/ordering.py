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

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from acp_bridge.wire.jsonrpc import CANCEL_REQUEST, Frame, Kind, RequestId, is_request_id

# The key that stands for the whole connection.
CONNECTION: Final = ("connection",)

Key: TypeAlias = tuple[Any, ...]

SESSION_CANCEL: Final = "session/cancel"
INITIALIZE: Final = "initialize"
SESSION_PROMPT: Final = "session/prompt"
# What a waiting frame that names no key is counted under.
_NOTHING: Final[list[Key]] = [("nothing",)]


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
    """Which client frames wait behind interceptions, and in what order they are let go.

    What a frame waits for costs what it names, not how many frames wait: the frames that
    wait are counted per key, and a walk of the queue (:meth:`releasable`) judges each
    frame once against the ones before it that stay.
    """

    def __init__(self) -> None:
        self._holds: dict[Key, Hold] = {}
        self._waiting: list[tuple[Frame, list[Key], bool]] = []
        # How many waiting frames name each key (those naming none: under _NOTHING).
        self._named: Counter[Key] = Counter()
        # Counts each hold let go or forwarded: a walk started before must look again at
        # the frames it passed over.
        self._loosened = 0
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
        """Whether ``frame`` may be processed now; if not, it is kept until it is
        :meth:`releasable`."""
        keys, cancels = frame_keys(frame)
        if self._held(keys, cancels) or _behind(keys, self._named):
            self._waiting.append((frame, keys, cancels))
            self._named.update(keys or _NOTHING)
            self.waiting_bytes += len(frame.raw)
            self._update()
            return False
        return True

    def forwarded(self, token: int) -> None:
        for hold in self._holds.values():
            if hold.token == token:
                hold.forwarded = True
                self._loosened += 1

    def answered(self, token: int) -> None:
        for key in [key for key, hold in self._holds.items() if hold.token == token]:
            del self._holds[key]
            self._loosened += 1
        self._update()

    def releasable(self) -> Iterator[Frame]:
        """The waiting frames that may go now, in order, each taken out of the queue as it
        is yielded. What the caller holds while it handles one counts for the frames after
        it; when it lets a hold go, the frames passed over are judged again."""
        while True:
            loosened = self._loosened
            passed: Counter[Key] = Counter()  # what the frames passed over name
            index = 0
            while index < len(self._waiting):
                frame, keys, cancels = self._waiting[index]
                if self._held(keys, cancels) or _behind(keys, passed):
                    passed.update(keys or _NOTHING)
                    index += 1
                    continue
                del self._waiting[index]
                for key in keys or _NOTHING:
                    self._named[key] -= 1
                    if not self._named[key]:
                        del self._named[key]
                self.waiting_bytes -= len(frame.raw)
                self._update()
                yield frame
                if self._loosened != loosened:
                    break
            else:
                return

    def _held(self, keys: list[Key], cancels: bool) -> bool:
        """Whether a hold keeps a frame naming ``keys`` waiting."""
        if CONNECTION in self._holds:
            return True
        for key in keys:
            hold = self._holds.get(key)
            if hold is not None and (not hold.forwarded or (hold.until_answered and not cancels)):
                return True
        return False


def _behind(keys: list[Key], named: Counter[Key]) -> bool:
    """The order rule, given what the frames before it name: frames that wait keep their
    order. A frame waits behind an earlier one of its keys, and behind any that names none
    (such a frame waits for the whole connection); a frame naming none waits only behind
    those."""
    return bool(named[_NOTHING[0]]) or any(named[key] for key in keys)


class AnswerHold:
    """Which agent frames for the client wait behind the bridge's answer to an intercepted
    request the agent has already answered (the mirror rule above), and when they go."""

    def __init__(self) -> None:
        # Interception token -> (the hop that answered, the sessions its frames wait for;
        # None: all of them).
        self._pending: dict[int, tuple[int, frozenset[str] | None]] = {}
        self._held: dict[int, list[bytes]] = {}  # hop -> frames for the client, in order
        self._held_bytes: dict[int, int] = {}  # hop -> the bytes of those frames

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
        self._held_bytes.setdefault(hop, 0)

    def holding(self, hop: int | None = None) -> bool:
        """Whether frames of ``hop`` (of any process: None) may have to wait now."""
        return bool(self._held) if hop is None else hop in self._held

    def held(self, hop: int) -> tuple[int, int]:
        """How many frames of ``hop`` wait now, and their bytes."""
        held = self._held.get(hop)
        return (0, 0) if held is None else (len(held), self._held_bytes[hop])

    def admit(self, hop: int, raw: bytes, message: Any) -> bool:
        """Whether a frame of ``hop`` for the client may go now; if not, it is kept."""
        held = self._held.get(hop)
        if held is None or not self._must_wait(hop, message):
            return True
        held.append(raw)
        self._held_bytes[hop] += len(raw)
        return False

    def answered(self, token: int) -> list[bytes]:
        """The bridge's answer for ``token`` is sent: the frames that follow it now."""
        pending = self._pending.pop(token, None)
        if pending is None or any(hop == pending[0] for hop, _ in self._pending.values()):
            return []
        self._held_bytes.pop(pending[0], None)
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
