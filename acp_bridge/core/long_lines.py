"""What becomes of a line the bridge does not decode into a value: one module decides.

A line of ``stream_after`` bytes or more (spec §2, with bounded memory), and a line json
cannot build (nested too deeply), are judged by :class:`~acp_bridge.wire.json_stream.LineValidator`
instead. :class:`LongLines` says, on the router's state at that moment, what becomes of
each; the runtime only moves the bytes it is told to (:mod:`acp_bridge.runtime.relay`).
The rules, in the order a line meets them:

1. **Stream or gather.** When the splitter offers a line's start, the validator judges it
   and reads its envelope. The line may go on as it arrives only if the router would pass
   it on unchanged, to the one other side, without holding it: its method known and not
   intercepted (nor ``authenticate``, nor a cancel), its id, if any, not one the router
   would translate, no interception holding client frames, one agent process, an answer
   only to a client request still pending (an answer the bridge waits for, or one to no
   request, must be seen whole); an agent's line not while frames of its process wait
   behind an answer, nor once the client is gone. Anything else, a start that is not valid
   JSON included, is gathered whole and received as any other line (:meth:`LongLines.start`
   returns None).
2. **What goes out.** Only judged bytes are released (:meth:`LongLine.take`): the start of
   a valid JSON text, always completable. The few bytes after them (a character, an
   escape or a literal cut by the end of a read) wait for the next piece.
3. **Its end.** A complete line that is valid JSON is recorded by the router as if it had
   come whole (a request registered for its answer, an answer resolved), and gets its last
   bytes (:meth:`LongLines.end`). If, complete, it is not one JSON-RPC message, or a member
   after the large one changed how it must be routed, it is cut.
4. **A cut.** A line that turns out invalid, that cannot go on unchanged, or that goes
   over the line limit is cut: what was released is ended as one valid message the
   receiver ignores (``LineValidator.cut_ending``, kept as of the last released piece),
   nothing if nothing went. The sender hears what it would have for the whole line: a
   client the error, with the request's id when the start named one; when an agent's line
   was the answer to a client request, the client gets an error for it
   (:meth:`LongLines.refused`).
5. **Arrived whole.** A long line that arrived in one read takes the validator too
   (:meth:`LongLines.whole`): if the router passes it on unchanged (rules 1 and 3 at once)
   it is recorded and goes on as it came; otherwise it is parsed the usual way.
6. **Not readable by json.** A line json's decoder refused is judged again without
   building it (:meth:`LongLines.unparsed`): valid JSON nested too deeply to build goes on
   by rule 5, whatever its length; otherwise a client line is answered (``-32600`` naming
   the limit, or ``-32700``, with the request's id when the line named one before its
   fault), and an agent line is dropped with a log line (its client told by rule 4).

Answers to the sender are queued in the router's output, like every other byte the
router has for a peer; the runtime takes them with ``Router.data_to_send``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from acp_bridge.core.pending import FromClient
from acp_bridge.core.router import AGENT_ANSWER_REFUSED, CLIENT, PRIMARY, Router
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import CANCEL_REQUEST, FrameError, JsonObject, Kind, is_request_id

if TYPE_CHECKING:
    from acp_bridge.wire.json_stream import Envelope, LineValidator

# json_stream (its tables and a dozen patterns compiled at import, 2.6 ms of a bridge's
# start) is imported by the first line that needs it: most connections never send one.

log = logging.getLogger("acp_bridge.long_lines")

ROUTE_CHANGED: Final = (
    "The bridge could not pass the message on as it came: a member after its large one "
    "changes how it must be routed."
)


@dataclass(slots=True)
class LongLine:
    """A line passed on while it is still arriving, from ``sender`` to ``receiver``."""

    validator: LineValidator
    sender: int
    receiver: int
    held: bytes = b""  # taken but not judged yet: not released
    released: int = 0
    ending: bytes | None = None  # ends what was released, should the line be cut

    def take(self, data: bytes) -> bytes:
        """Bytes the validator has taken without fault: those judged so far, to write."""
        judged = self.validator.judged
        count = judged - self.released
        if self.held:
            data = self.held + data
        piece = data if count == len(data) else data[:count]
        self.held = b"" if count == len(data) else data[count:]
        self.released = judged
        if piece:
            # Computed now, while the validator's state is that of the released bytes.
            self.ending = self.validator.cut_ending()
        return piece

    def request_id(self) -> jsonrpc.RequestId:
        """The id to answer the line with: its own if it is a request that named one."""
        return self.validator.envelope.request_id()


class LongLines:
    """The fate of the long lines (and lines json cannot build) of one connection,
    decided on its router's tables."""

    def __init__(self, router: Router) -> None:
        self.router = router

    # ------------------------------------------------------- passing as it arrives

    def start(self, sender: int, data: bytes, *, client_gone: bool = False) -> LongLine | None:
        """A line's start from ``sender`` (:data:`CLIENT` or an agent hop): the line to pass
        on as it arrives (write :meth:`LongLine.take` of ``data`` first), or None: gather it
        whole (rule 1)."""
        from acp_bridge.wire.json_stream import LineValidator

        validator = LineValidator()
        try:
            validator.feed(data)
            if (sender != CLIENT and client_gone) or _answers_both_ways(validator):
                return None
            receiver = self.receiver(sender, validator.envelope)
        except FrameError:
            return None
        return None if receiver is None else LongLine(validator, sender, receiver)

    def piece(self, line: LongLine, data: bytes) -> bytes:
        """The next piece of ``line``: the bytes to write now. FrameError: cut it."""
        line.validator.feed(data)
        if _answers_both_ways(line.validator):
            # Cut before the second of the two goes out: no ending could take it back.
            raise FrameError(jsonrpc.INVALID_REQUEST, jsonrpc.RESULT_AND_ERROR)
        return line.take(data)

    def end(self, line: LongLine, data: bytes) -> bytes:
        """The last piece of ``line``: record it, and the bytes that end it (the newline is
        the writer's). FrameError: cut it (rule 3)."""
        line.validator.feed(data)
        if not self.record(line.sender, line.receiver, line.validator.finish()):
            raise FrameError(jsonrpc.INVALID_REQUEST, ROUTE_CHANGED)
        return line.held + data

    def cut(self, line: LongLine, error: FrameError) -> bytes | None:
        """``line`` is cut for ``error``: answer its sender (rule 4), and return what ends
        the bytes released (None: nothing went, the receiver gets nothing more)."""
        if line.sender == CLIENT:
            log.warning("cut a long line from the client: %s", error.message)
            self.router.answer_error(line.request_id(), error.code, error.message)
        else:
            log.warning(
                "agent hop %d: cut a long line that is not JSON-RPC: %s", line.sender, error.message
            )
            self.refused(line.sender, line.validator.envelope)
        return self._ending(line)

    def overlong(self, sender: int, line: LongLine | None, size: int, limit: int) -> bytes | None:
        """A line from ``sender`` went over the line limit (``line``: the part passed on,
        if any): answer the sender (rule 4); what ends the bytes released, as :meth:`cut`."""
        if sender == CLIENT:
            self.router.answer_error(
                None if line is None else line.request_id(),
                jsonrpc.INVALID_REQUEST,
                f"The message is {size} bytes, more than the line limit of {limit} bytes.",
            )
        else:
            if line is not None:
                self.refused(sender, line.validator.envelope)
            log.warning("agent hop %d: dropped a %d-byte line over the line limit", sender, size)
        return None if line is None else self._ending(line)

    def refused(self, hop: int, envelope: Envelope, message: str = AGENT_ANSWER_REFUSED) -> None:
        """A line of process ``hop`` was not passed on, or was cut after its start went on:
        if it was the answer to a client request (as far as it was read), the client gets
        ``message`` as the error."""
        members = envelope.members
        if "method" in members or ("result" not in members and "error" not in members):
            return
        wire_id = members.get("id")
        if is_request_id(wire_id):
            self.router.lose_client_request(hop, wire_id, message)

    @staticmethod
    def _ending(line: LongLine) -> bytes | None:
        if not line.released:
            return None
        if line.ending is None:  # not expected: a line is passed only once it names its kind
            log.error("a long line was cut where it cannot be ended as JSON")
            return b""
        return line.ending

    # ------------------------------------------------------------ whole lines

    def whole(self, sender: int, raw: bytes) -> int | None:
        """A long line that arrived in one read: the peer to write it to as it came, once
        recorded; None: parse it the usual way (rule 5)."""
        from acp_bridge.wire.json_stream import LineValidator

        validator = LineValidator()
        try:
            validator.feed(raw)
            envelope = validator.finish()
        except FrameError:
            return None  # the usual way says why
        return self._pass_whole(sender, envelope)

    def unparsed(
        self, sender: int, raw: bytes, error: FrameError, *, tried_whole: bool
    ) -> int | None:
        """A line json's decoder refused with ``error`` (``tried_whole``: :meth:`whole` has
        judged it already): the peer to write it to as it came, or None once its sender has
        been answered or it was dropped (rule 6)."""
        from acp_bridge.wire import json_stream

        if (
            sender == CLIENT
            and error.code != jsonrpc.PARSE_ERROR
            and not isinstance(error, jsonrpc.NestedTooDeeply)
        ):
            # json's decoder read it whole: valid JSON, whose error names the request's id
            # where it has one. Judging it again would find no fault to answer instead.
            self.router.answer_error(error.request_id, error.code, error.message)
            return None
        envelope, fault = json_stream.judge(raw)
        if fault is None and isinstance(error, jsonrpc.NestedTooDeeply):
            receiver = None if tried_whole else self._pass_whole(sender, envelope)
            if receiver is not None:
                return receiver
            if sender == CLIENT:
                fault = FrameError(error.code, error.message, envelope.request_id())
            else:
                log.warning("agent hop %d: dropped a line: %s", sender, error.message)
                self.refused(sender, envelope, error.message)
                return None
        if sender == CLIENT:
            answered = fault or error
            self.router.answer_error(answered.request_id, answered.code, answered.message)
        else:
            log.warning(
                "agent hop %d: dropped a line that is not JSON-RPC (%s): %s",
                sender,
                (fault or error).message,
                _shown(raw, envelope, valid_json=fault is None),
            )
            self.refused(sender, envelope)
        return None

    def _pass_whole(self, sender: int, envelope: Envelope) -> int | None:
        router = self.router
        if sender == CLIENT:
            if router.gate.active or router.hops[PRIMARY].closed:
                return None
            receiver = PRIMARY
        elif router.answer_hold.holding(sender):
            return None
        else:
            receiver = CLIENT
        try:
            envelope.kind()
        except FrameError:
            return None
        return receiver if self.record(sender, receiver, envelope) else None

    # ------------------------------------------------------------- the rules

    def receiver(self, sender: int, envelope: Envelope) -> int | None:
        """Where a line from ``sender`` still arriving may go as it comes, or None (rule 1)."""
        router = self.router
        if sender == CLIENT:
            if len(router.hops) != 1 or router.gate.active or router.hops[PRIMARY].closed:
                return None
            if not self._client_may_pass(envelope.members, envelope.open_member):
                return None
            return PRIMARY
        if router.answer_hold.holding(sender):
            return None
        if not self._agent_may_pass(sender, envelope.members, envelope.open_member):
            return None
        return CLIENT

    def record(self, sender: int, receiver: int, envelope: Envelope) -> bool:
        """A complete line that is valid JSON, passed on as it came: the router records it
        as if it had come whole. False: it cannot go on unchanged after all (rule 3)."""
        kind = envelope.kind()
        message = envelope.skeleton()
        router = self.router
        if sender == CLIENT:
            if receiver != PRIMARY or len(router.hops) != 1:
                return False
            opened = "result" if kind is Kind.RESPONSE else "params"
            if not self._client_may_pass(message, opened):
                return False
            routed = router.record_from_client(kind, message)
            return routed is None or routed == (receiver, False)
        opened = "result" if kind is Kind.RESPONSE else "params"
        if not self._agent_may_pass(sender, message, opened):
            return False
        return router.record_from_agent(sender, kind, message) is False

    def _client_may_pass(self, members: JsonObject, open_member: str | None) -> bool:
        router = self.router
        request_id = members.get("id")
        if "id" in members and not is_request_id(request_id):
            return False
        if open_member == "params":
            method = members.get("method")
            return (
                type(method) is str
                and method not in router.intercepted
                and method not in (CANCEL_REQUEST, "authenticate")
                and request_id not in router.hops[PRIMARY].pending
            )
        if open_member in ("result", "error") and "id" in members and "method" not in members:
            target = router.agent_requests.get(request_id)
            return target is None or target == (PRIMARY, request_id)
        return False

    def _agent_may_pass(self, hop: int, members: JsonObject, open_member: str | None) -> bool:
        router = self.router
        request_id = members.get("id")
        if "id" in members and not is_request_id(request_id):
            return False
        if open_member == "params":
            return (
                type(members.get("method")) is str
                and members["method"] != CANCEL_REQUEST
                and request_id not in router.agent_requests
            )
        if open_member in ("result", "error") and "id" in members and "method" not in members:
            # Only the answer to a client request still pending (one that is not is dropped
            # whole, so it must be gathered whole).
            return router.hops[hop].pending.get(request_id) == FromClient(request_id)
        return False


def _answers_both_ways(validator: LineValidator) -> bool:
    """Whether a line read so far as an answer names both ``result`` and ``error``, which
    JSON-RPC forbids (a message that names a method is a request or notification)."""
    if type(validator.envelope.members.get("method")) is str:
        return False
    return validator.names_result_and_error()


def _shown(raw: bytes, envelope: Envelope, *, valid_json: bool) -> str:
    """What the log shows of an agent line it dropped: of a message (valid JSON), which may
    carry the prompt, only its id; of anything else (an agent's stray output), its start."""
    if not valid_json:
        return raw[:200].decode(errors="replace")
    members = envelope.members
    if "id" in members and is_request_id(members["id"]):
        return f"id {members['id']!r}, its content not logged"
    return "its content not logged"
