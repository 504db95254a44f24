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

    def admit(self, frame: Frame) -> bool:
        """Whether ``frame`` may be processed now; if not, it is kept until :meth:`release`."""
        keys, cancels = frame_keys(frame)
        if self._blocked(keys, cancels, len(self._waiting)):
            self._waiting.append((frame, keys, cancels))
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
