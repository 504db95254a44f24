"""Validating one JSON line as it arrives, without holding or building it: sans-IO.

A line too long to hold whole is passed on while it is still arriving (see
:mod:`acp_bridge.wire.framing` and ``Router.stream_from_client``). It must still be valid JSON
and a JSON-RPC message before its end goes out, so :class:`LineValidator` reads it piece
by piece and keeps only the text it has not judged yet and a stack of open containers:

- a string is skipped with ``str.find`` (quotes, backslashes) and checked for control
  characters only where the raw bytes had any (they are rare and never inside a UTF-8
  sequence);
- a value that is complete within the text held is checked at once by json's own C
  scanner (it builds the value, but only of what is held, at most one read; a container
  inside one found too long for that gets only a short look, not a long one that would
  read as far again);
- a string with escapes is judged by json's C string scanner where it lies in the text
  held, never in a copy of all that follows it;
- a container that does not end within the text held is entered token by token, and
  json's scanner never reads again what a scan that failed has read, so judging costs
  the line's length whatever its nesting;
- deep nesting is entered and left a run at a time, one regular-expression match for
  many levels: openings with the short items or members before the next (``[1,[1,…``,
  ``[{},[{},…``), and closings with those after each (``…1],1]``, ``…[1,2]],[1,2]]``),
  spaced or not; a short item is a scalar or a flat container of them;
- many small items or members of a container entered (``[{"a":[1,2]},…``, ``{"k0":0,…``)
  are judged a run at a time: json's scanner reads the text up to a comma between them,
  closed as a container of their kind.

It accepts exactly the JSON that :func:`acp_bridge.wire.jsonrpc.parse` accepts (strict UTF-8,
no byte order mark, no ``NaN``/``Infinity``, no control characters in strings, numbers of
any length), except that it has no nesting limit (its stack is a byte per open container,
not recursion: deep nesting holds about its own length). A
number is judged as it arrives, by its shape, so a long one costs time linear in its
length. Of the top-level object it remembers the small members (``jsonrpc``, ``id``,
``method``) and the type of the large ones, which is what routing needs, and of an
``error`` member the types of its ``code`` and ``message``, which is what judging an answer
needs (:class:`Envelope`): it classifies a line as :func:`acp_bridge.wire.jsonrpc.parse`
does.

What has been judged is known to the byte (:attr:`LineValidator.judged`): a line passed on
as it arrives releases only judged bytes, and should the line turn out invalid after all,
:meth:`LineValidator.cut_ending` gives the text that ends what was released as one valid
JSON-RPC message its receiver ignores (see docs/architecture.md, "Long lines").
"""

from __future__ import annotations

import codecs
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from json import decoder
from json.scanner import make_scanner
from typing import Any, Final, NamedTuple

from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import FrameError, Kind

# Raw bytes that may appear in a valid line only outside strings (JSON whitespace): any
# other control byte makes the line invalid wherever it is.
_WHITESPACE_CONTROLS: Final = b"\t\r"
_NOT_CONTROL: Final = bytes(range(0x20, 0x100))
_OTHER_CONTROLS: Final = tuple(
    bytes([byte]) for byte in range(0x20) if byte not in _WHITESPACE_CONTROLS
)
# A piece this long is searched for control bytes once per byte value (memchr, many bytes
# a step: 40 us for 128 KiB against 95 us for one pass of bytes.translate); a shorter one
# gets the pass, which costs less than 31 searches below about this size.
_SEARCH_EACH_FROM: Final = 32 * 1024
_CLOSER_OF: Final = bytes.maketrans(b"\x00\x01", b"]}")  # an open container's byte -> closer
_WS: Final = re.compile(r"[ \t\n\r]*")
# A string body with escapes, up to its closing quote (or an escape it cannot judge yet).
_CONTROL_IN_STRING: Final = re.compile(r"[\x00-\x1f]")
# Array items that are short scalars, each followed by a comma: matched many at a time
# (one regular-expression call instead of a Python step per item). Integers longer than
# json reads (4,300 digits) are left to the scanner, which refuses them. The runs of
# digits, spaces and string characters are possessive (``*+``): what follows one can never
# be another of its characters, so giving some back can never make a match, and trying it
# cost a step per character given back (an integer of 5,000 digits: 0.43 ms, 0.02 now).
_WS_CLASS: Final = r"[ \t\r]*+"
_SCALAR: Final = (
    r"(?:-?(?:0|[1-9][0-9]{0,4299}+)(?:\.[0-9]++)?(?:[eE][-+]?[0-9]++)?"
    r'|true|false|null|"[^"\\\x00-\x1f]*+")'
)
_FLAT_MEMBER: Final = rf'{_WS_CLASS}"[^"\\\x00-\x1f]*+"{_WS_CLASS}:{_WS_CLASS}{_SCALAR}{_WS_CLASS}'
# Array items that are short scalars or flat objects of them, each followed by a comma.
_SCALAR_RUN: Final = re.compile(
    rf"(?:{_WS_CLASS}(?:{_SCALAR}|\{{(?:{_FLAT_MEMBER},)*{_FLAT_MEMBER}\}}|\{{{_WS_CLASS}\}}"
    rf"|\[{_WS_CLASS}\]){_WS_CLASS},)+"
)
_WHOLE_AT_ONCE: Final = 64 * 1024  # a container is judged by json's scanner up to this size
_SCAN_WINDOWS: Final = (2 * 1024, _WHOLE_AT_ONCE)  # most are small: a short look first
_RUN_WINDOW: Final = 16 * 1024  # longer matches slow the engine down and cost it memory
# What may follow a number at the end of the text held and still belong to it.
_NUMBER_REST: Final = re.compile(r"[0-9.eE+-]*")
_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
# What a number may start as and still be completed.
_NUMBER_PREFIX: Final = re.compile(
    r"-?(?:(?:0|[1-9][0-9]*)(?:\.(?:[0-9]+(?:[eE][-+]?[0-9]*)?)?|[eE][-+]?[0-9]*)?)?"
)
_DIGITS: Final = re.compile(r"[0-9]{2,}")
# Nested openings, and closings: deep nesting is entered and left a run at a time. An
# opening is an array with the short scalar items before the next opening
# (``[1,[1,[1,…``), or an object with its first key and the members of short scalars
# before the next (``{"a":1,"b":{…``). The items and members are possessive: what follows
# them in a run is an opening, which no scalar starts as.
_KEY_COLON: Final = rf'"[^"\\\x00-\x1f]*+"{_WS_CLASS}:{_WS_CLASS}'
_OPENER: Final = (
    rf"(?:\[++{_WS_CLASS})++(?:{_SCALAR}{_WS_CLASS},{_WS_CLASS})*+"
    rf"|\{{{_WS_CLASS}{_KEY_COLON}(?:{_SCALAR}{_WS_CLASS},{_WS_CLASS}{_KEY_COLON})*+"
)
_OPENERS: Final = re.compile(rf"(?:{_OPENER})+")
# Where that run stops short, openings with flat containers of short scalars among their
# items as well (``[[1,2],[[1,2],…``, ``[{},[{},…``, ``{"a":{},"b":{…``): taken the other
# way, a level cost a few Python steps. A bracket followed by another opening is one more;
# one followed by anything else is an item if it starts a flat container followed by a
# comma, else the next opening. A flat container is tried only where a closer comes before
# the next opening. (Slower than the run above: only where that one stops short.)
_CLOSER_FIRST: Final = r"[^\[\]{}]*+[\]}]"  # after an opening: a closer before any bracket
_FLAT: Final = (
    rf"(?=[\[{{]{_CLOSER_FIRST})"
    rf"(?:\[{_WS_CLASS}(?:{_SCALAR}{_WS_CLASS},{_WS_CLASS})*+{_SCALAR}{_WS_CLASS}\]|\[{_WS_CLASS}\]"
    rf"|\{{(?:{_FLAT_MEMBER},)*+{_FLAT_MEMBER}\}}|\{{{_WS_CLASS}\}})"
)
_ITEM: Final = rf"(?:{_SCALAR}|{_FLAT})"
_FLAT_OPENER: Final = (
    rf"\[{_WS_CLASS}(?:\[(?=[ \t\r]*+[\[{{]){_WS_CLASS})*+(?:{_ITEM}{_WS_CLASS},{_WS_CLASS})*+"
    rf"|\{{{_WS_CLASS}{_KEY_COLON}(?:{_ITEM}{_WS_CLASS},{_WS_CLASS}{_KEY_COLON})*+"
)
_FLAT_OPENERS: Final = re.compile(rf"(?:{_FLAT_OPENER})+")
# Where the plain run stopped at an opening or in an item that a closer and a comma end:
# the flat one may go further. (Not within this much of the window's end: the window
# stopped it.)
_FLAT_NEXT: Final = re.compile(r'[\[{]|(?:"[^"]*+"|[^\[\]{}"])*+[\]}][ \t\r]*+,')
_SHORT_OF_WINDOW: Final = 256
# A run of openings without its strings, flat containers (once without their strings, no
# bracket is inside one), scalars, spaces, commas and colons is a byte per container, which
# _CONTAINER_OF turns into the stack's byte. (A run of closings is read back the same way.)
_STRING_TEXT: Final = re.compile(r'"[^"]*"')
_FLAT_TEXT: Final = re.compile(rf"[\[{{]{_CLOSER_FIRST}")
_BETWEEN_OPENINGS: Final = b" \t\r:,-+.0123456789eEtrufalsn"
_CONTAINER_OF: Final = bytes.maketrans(b"[{", b"\x00\x01")
_CLOSERS: Final = re.compile(r"[\]}]+")
# A run of closings, spaced or not, each followed by the short scalar items or members
# that come after it in its parent (``…1] ,2],"k":3}``); an item is taken only once what
# follows it shows that it is complete. Read back (:func:`_item_marks`) with the scalars
# and keys as ``v`` (a flat container too, once its strings are), without spaces and
# commas, a member as ``K`` and an item as ``V``: ``]VV}K``.
_CLOSING: Final = re.compile(
    rf"[\]}}]{_WS_CLASS}(?:,{_WS_CLASS}(?:{_KEY_COLON})?{_SCALAR}{_WS_CLASS}(?=[,\]}}]))*+"
)
_CLOSINGS: Final = re.compile(rf"(?:{_CLOSING.pattern})+")
# Where that run stops short, closings with flat containers among the items as well.
_FLAT_CLOSING: Final = re.compile(
    rf"[\]}}]{_WS_CLASS}(?:,{_WS_CLASS}(?:{_KEY_COLON})?{_ITEM}{_WS_CLASS}(?=[,\]}}]))*+"
)
_FLAT_CLOSINGS: Final = re.compile(rf"(?:{_FLAT_CLOSING.pattern})+")
# Where the plain run of closings stopped at an item that starts with a bracket.
_FLAT_CLOSING_NEXT: Final = re.compile(rf"{_WS_CLASS},{_WS_CLASS}(?:{_KEY_COLON})?[\[{{]")
# What follows a run of bare closers when closings with spaces or items go on.
_ITEM_NEXT: Final = re.compile(
    rf'[ \t\r]*(?:,[ \t\r]*)?(?:[\]}}"0-9tfn-]|[\[{{](?={_CLOSER_FIRST}))'
)  # (a bracket: one that a closer follows before any other, which may start a flat item)
_CLOSING_SCALAR: Final = re.compile(r'"[^"]*"|-?[0-9][0-9.eE+-]*|true|false|null')
_CLOSING_SPACE: Final = re.compile(r"[ \t\r,]+")
_CLOSER: Final = re.compile(r"[\]}]")
_ITEMS_OF: Final = bytes.maketrans(b"\x00\x01", b"VK")  # a container's byte -> its items
# A run of items handed to json's scanner at once is at least this long (a shorter one is
# walked an item at a time), and ends at one of the last few commas before the window's end
# that are outside strings and nested containers as far as counting quotes and brackets
# tells; json's scanner has the last word.
_ITEMS_AT_LEAST: Final = 512
_ITEMS_CUTS: Final = 8
_ITEMS_COMMAS: Final = 32  # fewer commas in a window: its items are not small
_BRACKET: Final = re.compile(r'[\[\]{}"]')
# A top-level member value kept for routing: an id, a method name.
_SMALL: Final = 1024
# The top-level members routing reads (jsonrpc.classify_message): any other is judged and
# not kept (a line of many small ones held several times its size).
_ENVELOPE_KEYS: Final = frozenset({"jsonrpc", "id", "method", "params", "result", "error"})
# Where one may be named: a run of top-level members stops before it (one written with
# escapes is found in what the run read, and the run is walked instead).
_ENVELOPE_KEY: Final = re.compile(r'"(?:jsonrpc|id|method|params|result|error)"')
# After json's scanner ran out of recursion on a container, this many containers are
# entered without trying it again (it fails after about a thousand levels).
_UNSCANNED_AFTER_DEEP: Final = 256
# json's C string scanner (typeshed does not declare it): (text, index after the opening
# quote, strict) -> (the string, index after the closing quote).
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = decoder.scanstring  # type: ignore[attr-defined]
_scan_once: Final[Callable[[str, int], tuple[Any, int]]] = make_scanner(jsonrpc._DECODER)  # type: ignore[arg-type]
# How json's string scanner says the text ended inside the string (all of it judged).
_UNTERMINATED: Final = "Unterminated string starting at"

# What the validator expects next.
_VALUE, _FIRST_VALUE, _FIRST_KEY, _KEY, _COLON, _AFTER_VALUE, _STRING, _DONE, _NUMBER_GOES_ON = (
    range(9)
)
_UNKNOWN: Final = object()
# The method a line cut short is ended with: an extension method (ACP: a leading
# underscore), which a peer ignores as a notification and refuses as a request.
CUT_METHOD: Final = "_acp-bridge/cut_line"


@dataclass(frozen=True, slots=True)
class Large:
    """A top-level member too large to keep: only its JSON type is known."""

    type: type


@dataclass(slots=True)
class Envelope:
    """What routing needs of a line: its top-level members, the large ones as :class:`Large`;
    an ``error`` object as one holding only its ``code`` and ``message``, texts replaced
    by an empty one and containers by an empty one of their type (what
    :func:`jsonrpc.answer_fault` judges of it)."""

    members: dict[str, Any] = field(default_factory=dict)
    is_object: bool = False
    open_member: str | None = None
    """The top-level member whose value is still arriving (None: between members)."""

    def skeleton(self) -> dict[str, Any]:
        """The members, large ones replaced by an empty value of their type."""
        return {
            key: value.type() if isinstance(value, Large) else value
            for key, value in self.members.items()
        }

    def kind(self) -> Kind:
        """The message's kind by :func:`jsonrpc.classify_message`; raises FrameError."""
        if not self.is_object:
            raise FrameError(jsonrpc.INVALID_REQUEST, "A streamed line must be one object.")
        if isinstance(self.members.get("id"), Large):
            raise FrameError(
                jsonrpc.INVALID_REQUEST,
                f"The id is longer than the bridge reads without parsing the line "
                f"({_SMALL} characters).",
            )
        return jsonrpc.classify_message(self.skeleton(), b"").kind

    def request_id(self) -> jsonrpc.RequestId:
        """The id to answer the line with: its own if it is a request that named one."""
        request_id = self.members.get("id")
        if "method" in self.members and jsonrpc.is_request_id(request_id):
            return request_id
        return None


class LineValidator:
    """Feed a line's bytes in pieces; :meth:`feed` and :meth:`finish` raise
    :class:`FrameError` (a parse error) as soon as the line cannot be valid JSON."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._text = ""  # decoded text not judged yet
        self._stack = bytearray()  # per open container, 1: an object, 0: an array
        self._expect = _VALUE
        self._in_key = False  # the string being skipped is an object key
        # A top-level key, or a top-level member's string value, being skipped, so far.
        self._string_text: list[str] | None = None
        self._key: str | None = None  # the top-level key whose value comes next
        self._controls = False  # tabs or carriage returns arrived (checked inside strings)
        self._started = False
        self._number_shape = ""  # a number still arriving, its digit runs shortened
        self._number_text: list[str] | None = None  # and its text, for a top-level member
        self._fed = 0  # bytes fed
        self._closed_at = -1  # the byte that closed the top-level value
        self._top_members = 0
        self._unscanned = 0  # containers to enter without trying json's scanner first
        # A container that starts before this position of the text held is entered without
        # json's scanner: a scan that failed read that far already (see _scan_reach).
        self._scan_from = 0
        # Items from before this position of the text held are walked one at a time: a run
        # tried there was refused (json's scanner has judged up to there at most once).
        self._items_from = 0
        self._run_depth = 0  # the depth of the container whose items were last taken as a run
        # The depth of the open container too long for json's scanner to judge at once
        # (-1: none): the containers inside it get only the short look.
        self._too_long_at = -1
        self._error: _ErrorObject | None = None  # the top-level error object, entered
        self.envelope = Envelope()

    @property
    def judged(self) -> int:
        """How many of the bytes fed are judged: they belong to a valid start of a JSON
        text. The bytes after them (a character, escape or literal cut by the end of a
        piece) wait for the next piece. The top-level value's closing bracket counts as
        judged only once the line is finished, so a line cut at its end can still be
        ended as :meth:`cut_ending` has it."""
        if self._expect == _DONE and self._closed_at >= 0:
            return self._closed_at
        waiting = self._decoder.getstate()[0]
        return self._fed - len(self._text.encode()) - len(waiting)

    def cut_ending(self) -> bytes | None:
        """What ends the judged bytes as one valid JSON-RPC message the receiver ignores
        (see :func:`_cut_ending`); None when nothing can."""
        return _cut_ending(self)

    def names_result_and_error(self) -> bool:
        """Whether what is judged names both ``result`` and ``error`` at the top level, which
        no JSON-RPC message does (and no ending can take back)."""
        return _answer_keys(self) == (True, True)

    # ------------------------------------------------------------------ input

    def feed(self, data: bytes) -> None:
        self._fed += len(data)
        other, whitespace = _controls_in(data)
        if other:
            raise _invalid("a control character outside the JSON grammar")
        if whitespace:
            self._controls = True
        elif (
            self._expect == _STRING
            and not self._in_key
            and not self._text
            and self._string_text is None
        ):
            data = self._skip_string_bytes(data)
            if not data:
                return
        try:
            text = self._decoder.decode(data)
        except UnicodeDecodeError as exc:
            raise _invalid(f"not UTF-8 ({exc.reason})") from None
        if not self._started and text:
            self._started = True
            if text.startswith("\ufeff"):
                raise _invalid("a byte order mark")
        self._text = self._text + text if self._text else text
        self._run(final=False)

    def _skip_string_bytes(self, data: bytes) -> bytes:
        """Inside a string value, with no control byte in ``data``: skip the string's text
        without decoding it (the bulk of a long line); what follows its end, if it ends."""
        end = _string_end(data, self._decoder)
        if end is None:
            return data
        self._started = True
        if end == len(data):
            return b""
        self._value_done(_UNKNOWN)
        return data[end + 1 :]

    def finish(self) -> Envelope:
        """The line is complete: its envelope, if it is one valid JSON value."""
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            raise _invalid(f"not UTF-8 ({exc.reason})") from None
        self._run(final=True)
        if self._expect != _DONE:
            raise _invalid("the line ends inside a value")
        return self.envelope

    # ---------------------------------------------------------------- the walk

    def _run(self, *, final: bool) -> None:
        text = self._text
        pos = 0
        end = len(text)
        while True:
            expect = self._expect
            if expect == _DONE and self._closed_at < 0:
                self._closed_at = self._byte_at(text, pos - 1)
            if expect == _NUMBER_GOES_ON:
                pos = self._number_goes_on(text, pos, final)
                if pos < 0:
                    pos = end
                    break
                continue
            if expect == _STRING:
                after = self._string(text, pos, final)
                if after < 0:
                    pos = -after - 1
                    break
                self._string_done(text, pos, after)
                pos = after
                continue
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]  # always matches
            if pos >= end:
                break
            char = text[pos]
            if expect in (_VALUE, _FIRST_VALUE):
                after = self._value_or_run(text, pos, final)
                if after < 0:
                    break
                pos = after
            else:
                if expect == _AFTER_VALUE and char in "]}" and len(self._stack) > 2:
                    closed = _close_run(self, text, pos)
                    if closed:
                        pos += closed
                        continue
                elif expect in (_KEY, _FIRST_KEY) and char == '"':
                    after = _items_run(self, text, pos, final)
                    if after < 0:
                        break
                    if after > pos:
                        pos = after
                        continue
                self._punctuation(expect, char)
                pos += 1
        self._text = text[pos:]
        self._scan_from = max(0, self._scan_from - pos)
        self._items_from = max(0, self._items_from - pos)

    def _value_or_run(self, text: str, pos: int, final: bool) -> int:
        """Where a value is expected: take it, or a run of several (array items, nested
        openings); the position after what was taken, or -1 to wait for more text."""
        char = text[pos]
        if char == "]" and self._expect == _FIRST_VALUE:
            self._close()
            return pos + 1
        if self._error is not None and len(self._stack) == 2:
            self._error.value_starts(char)
        in_array = self._stack and not self._stack[-1]
        if in_array:
            # Array items that are short scalars, many at a time, without building them.
            run = _SCALAR_RUN.match(text, pos, min(len(text), pos + _RUN_WINDOW))
            if run is not None:
                self._expect = _VALUE
                return run.end()
            after = _items_run(self, text, pos, final)
            if after != pos:
                return after
        if char in "[{" and (self._unscanned or pos < self._scan_from) and len(self._stack) >= 2:
            # Deep nesting, or inside what a failed scan read: a run of openings at a time.
            after = _openings_end(text, pos, min(len(text), pos + _RUN_WINDOW))
            if after > pos:
                return _open_run(self, text, pos, after)
        return self._value(text, pos, final)

    def _byte_at(self, text: str, pos: int) -> int:
        """The position in the line's bytes of ``text[pos]`` (text is the tail held)."""
        return self._fed - len(text[pos:].encode()) - len(self._decoder.getstate()[0])

    def _number_goes_on(self, text: str, pos: int, final: bool) -> int:
        """A number cut by the end of a piece goes on at ``pos``: the position after it,
        or -1 when it reaches the end of the text held too."""
        end = _NUMBER_REST.match(text, pos).end()  # type: ignore[union-attr]  # always matches
        self._number_part(text[pos:end])
        if end == len(text) and not final:
            return -1
        self._number_done()
        return end

    def _number_part(self, part: str) -> None:
        shape = _DIGITS.sub(_shorten_digits, self._number_shape + part)
        if not _NUMBER_PREFIX.fullmatch(shape):
            raise _invalid(f"a malformed number (…{part[-10:]!r})")
        self._number_shape = shape
        if self._number_text is not None:
            self._number_text.append(part)
            if sum(map(len, self._number_text)) > _SMALL:
                self._number_text = None  # no number routing looks at is this long

    def _number_done(self) -> None:
        if not _NUMBER.fullmatch(self._number_shape):
            raise _invalid("a number cut short")
        value: Any = _UNKNOWN
        if self._number_text is not None:
            value = _number_value("".join(self._number_text))
        elif len(self._stack) == 1 and self._key is not None:
            value = Large(int)
        if self._error is not None and self._error.number is not None:
            self._error.number_ends(self._number_shape)
        self._number_shape = ""
        self._number_text = None
        self._value_done(value)

    def _punctuation(self, expect: int, char: str) -> None:
        """Take the one character ``char`` between values."""
        if expect == _AFTER_VALUE:
            if char == ",":
                self._expect = _KEY if self._stack[-1] else _VALUE
            elif char == ("}" if self._stack[-1] else "]"):
                self._close()
            else:
                raise _invalid(f"expected ',' or a closing bracket, got {char!r}")
        elif expect in (_FIRST_KEY, _KEY):
            if char == "}" and expect == _FIRST_KEY:
                self._close()
            elif char == '"':
                self._in_key = True
                depth = len(self._stack)
                self._string_text = (
                    [] if depth == 1 or (depth == 2 and self._error is not None) else None
                )
                self._expect = _STRING
            else:
                raise _invalid(f"expected a property name, got {char!r}")
        elif expect == _COLON:
            if char != ":":
                raise _invalid(f"expected ':', got {char!r}")
            self._expect = _VALUE
        else:  # _DONE: only whitespace may follow
            raise _invalid("more after the value")

    def _value(self, text: str, pos: int, final: bool) -> int:
        """Read a value at ``pos``: the position after it (or after its opening, for one
        that does not end within the text held), or -1 to wait for more text."""
        char = text[pos]
        if char == '"':
            return self._string_value(text, pos, final)
        if char in {"{", "["}:
            scanned = self._scan_container(text, pos)
            if scanned is not None:
                self._value_done(scanned[0])
                return scanned[1]
            # Not complete within the text held (or invalid further on, or deep): enter it
            # and judge it token by token.
            is_object = char == "{"
            if not self._stack:
                self.envelope.is_object = is_object
            self._open(Large(dict if is_object else list))
            self._stack.append(is_object)
            self._expect = _FIRST_KEY if is_object else _FIRST_VALUE
            return pos + 1
        if char in _NUMBER_START:
            # By its shape, not through json's scanner: it may go on in the next piece,
            # and may have more digits than int() converts.
            end = _NUMBER_REST.match(text, pos).end()  # type: ignore[union-attr]  # always matches
            self._number_shape = ""
            keep = len(self._stack) == 1 and self._key is not None
            self._number_text = [] if keep else None
            self._number_part(text[pos:end])
            if end == len(text) and not final:
                self._expect = _NUMBER_GOES_ON
                return end
            self._number_done()
            return end
        try:
            value, after = _scan_once(text, pos)
        except StopIteration:
            if not final and len(text) - pos < 6:
                return -1  # a literal cut short
            raise _invalid(f"expected a value, got {text[pos : pos + 10]!r}") from None
        except ValueError as exc:  # NaN, Infinity
            raise _invalid(str(exc)) from None
        self._value_done(value)
        return after

    def _scan_container(self, text: str, pos: int) -> tuple[Any, int] | None:
        """json's scanner on the container at ``pos`` where it may succeed: its value and
        the position after it, or None to enter it."""
        if self._unscanned:  # deep here: the scanner would fail again
            self._unscanned = self._unscanned - 1 or _UNSCANNED_AFTER_DEEP
            return None
        if pos < self._scan_from:
            return None
        long_look = self._too_long_at < 0
        try:
            return _scan_small(text, pos, long_look=long_look)
        except RecursionError:
            # Each try goes a thousand levels down before it fails: the next containers
            # are entered without one, so deep nesting costs linear time.
            self._unscanned = _UNSCANNED_AFTER_DEEP
        except (ValueError, StopIteration):
            if long_look and len(text) - pos > _WHOLE_AT_ONCE:
                # Longer than the long look (or invalid within it): a container inside it
                # that reaches as far would be read as far again.
                self._too_long_at = len(self._stack)
        self._scan_from = pos + _scan_reach(len(text) - pos)
        return None

    def _string_value(self, text: str, pos: int, final: bool) -> int:
        """Read a string value at ``pos``: the position after it, or where its text stops
        in the text held (judged up to there) when it does not end within it."""
        if len(self._stack) == 1 and self._key is not None:
            self._string_text = []  # kept should it not end in the text held
        after = self._string(text, pos + 1, final)
        if after < 0:
            self._open(Large(str))
            self._in_key = False
            self._expect = _STRING
            return -after - 1
        self._string_text = None
        if after - pos <= _SMALL:
            value, after = _scan_once(text, pos)
            self._value_done(value)
        else:
            self._value_done(Large(str))
        return after

    def _string(self, text: str, pos: int, final: bool) -> int:
        """Skip string text from ``pos``: the position after the closing quote, or
        ``-(resume + 1)`` when the text held ends first."""
        quote = text.find('"', pos)
        stop = quote if quote >= 0 else len(text)
        if text.find("\\", pos, stop) < 0:
            if self._controls and _CONTROL_IN_STRING.search(text, pos, stop):
                raise _invalid("a control character in a string")
            if quote < 0:
                return self._string_cut(text, pos, len(text))
            return quote + 1
        # Escapes: json's C string scanner judges the text up to a point that splits no
        # escape, closed with a quote of our own; it stops at the string's real end if
        # that comes first.
        cut = len(text) if final else _escape_safe_cut(text, pos)
        if not final:
            # First on the text held, in place: copying the rest of it for each string
            # made a line of many such strings (a skill's markdown) cost its length squared.
            try:
                after = _scanstring(text, pos, True)[1]
            except ValueError as exc:
                if cut == len(text) and getattr(exc, "msg", "").startswith(_UNTERMINATED):
                    return self._string_cut(text, pos, cut)  # judged to the end held
            else:
                if after <= cut:
                    return after
        try:
            after = _scanstring(text[pos:cut] + '"', 0, True)[1] + pos
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        if after <= cut:
            return after
        return self._string_cut(text, pos, cut)

    def _string_cut(self, text: str, pos: int, resume: int) -> int:
        if self._string_text is not None:
            self._string_text.append(text[pos:resume])
            if sum(map(len, self._string_text)) > _SMALL:
                self._string_text = None  # no key or value routing reads is this long
        return -(resume + 1)

    def _string_done(self, text: str, pos: int, after: int) -> None:
        """A string skipped in :meth:`_string` has ended at ``after``."""
        if not self._in_key:
            if self._string_text is not None and self._key is not None:
                # A top-level member's value, short after all (as one held whole would be).
                raw = "".join(self._string_text) + text[pos : after - 1]
                self._string_text = None
                if len(raw) + 2 <= _SMALL:
                    self.envelope.members[self._key] = _scan_once('"' + raw + '"', 0)[0]
            self._value_done(_UNKNOWN)
            return
        self._in_key = False
        self._expect = _COLON
        depth = len(self._stack)
        if depth != 1 and (depth != 2 or self._error is None):
            return
        key: str | None = None  # too long to be one routing reads
        if self._string_text is not None:
            raw = "".join(self._string_text) + text[pos : after - 1]
            key = _scan_once('"' + raw + '"', 0)[0]
            self._string_text = None
        if depth == 1:
            self._key = key if key in _ENVELOPE_KEYS else None
        elif self._error is not None:  # depth 2: a key of the error object
            self._error.key = key

    def _open(self, large: Large) -> None:
        """A value that does not end within the text held starts here."""
        if len(self._stack) == 1 and self._key is not None:
            self.envelope.members[self._key] = large
            self.envelope.open_member = self._key
            if self._key == "error" and large.type is dict:
                self._error = _ErrorObject()

    def _close(self) -> None:
        self._stack.pop()
        if len(self._stack) <= self._too_long_at:
            self._too_long_at = -1
        if self._error is not None and len(self._stack) == 1:
            self.envelope.members["error"] = self._error.kept
            self._error = None
        self._value_done(_UNKNOWN)

    def _value_done(self, value: Any) -> None:
        depth = len(self._stack)
        if depth == 0 and type(value) is dict:  # the whole line was held: read at once
            self.envelope.is_object = True
            self.envelope.members = {
                key: _member(key, item) for key, item in value.items() if key in _ENVELOPE_KEYS
            }
            self._top_members = len(value)
        if depth == 1:
            self._top_members += 1
            key = self._key
            if key is not None:
                if self.envelope.open_member == key:
                    self.envelope.open_member = None
                elif value is not _UNKNOWN:
                    self.envelope.members[key] = _member(key, value)
            self._key = None
        self._expect = _DONE if depth == 0 else _AFTER_VALUE


class _ErrorObject:
    """The top-level ``error`` object of a line, entered token by token: what the envelope
    keeps of it (:func:`_member`), as it arrives."""

    __slots__ = ("kept", "key", "number")

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}
        self.key: str | None = None  # its own key whose value comes next
        self.number: str | None = None  # the key whose number is still arriving

    def value_starts(self, char: str) -> None:
        """A value of the object starts with ``char``: kept if it is the ``code`` or the
        ``message``, by its type (a number's once it has ended, :meth:`number_ends`)."""
        key, self.key = self.key, None
        if key not in ("code", "message"):
            return
        if char in _NUMBER_START:
            self.number = key
            self.kept[key] = 0
        elif char in _LITERALS:
            self.kept[key] = _LITERALS[char]
        else:
            self.kept[key] = "" if char == '"' else {} if char == "{" else []

    def number_ends(self, shape: str) -> None:
        """The number of :attr:`number` has ended; ``shape`` is its shape."""
        if self.number is not None:
            self.kept[self.number] = 0.0 if _FRACTION.search(shape) else 0
            self.number = None


def _cut_ending(validator: LineValidator) -> bytes | None:
    """What ends the judged bytes of ``validator`` as one valid JSON-RPC message that the
    receiver ignores: the values and containers left open are closed with ``null`` or what
    completes them, and the top-level object gets a second member of the same name as the
    one that made it a message, which replaces it for a JSON reader (the last of two
    members wins; a strict one refuses the line): ``method`` becomes :data:`CUT_METHOD`
    with empty params, an answer's ``id`` becomes null (and it gets a null ``result`` if it
    had none yet, or a whole ``error`` after one that may be incomplete). None when the
    bytes judged are not inside a top-level object of either kind, or name both ``result``
    and ``error`` (see :meth:`LineValidator.names_result_and_error`)."""
    stack = validator._stack
    envelope = validator.envelope
    members = envelope.members
    if validator._expect == _DONE:
        if not envelope.is_object:
            return None
        closing, has_member = "", validator._top_members > 0
    elif not stack or not stack[0]:
        return None
    else:
        closing, has_member = _closing(validator)
    if type(members.get("method")) is str:
        override = f'"method":"{CUT_METHOD}","params":{{}}'
    elif "id" in members:
        override = '"id":null'
        result, error = _answer_keys(validator)
        if result and error:
            return None  # a line is never released this far (LongLines.piece)
        if error:
            # Its error object may lack what JSON-RPC requires: one that does not.
            override += _CUT_ERROR
        elif not result:
            override += ',"result":null'
    else:
        return None
    return (closing + ("," if has_member else "") + override + "}").encode()


def _answer_keys(validator: LineValidator) -> tuple[bool, bool]:
    """Whether the top-level object names ``result``, and ``error``: as a member, or as the
    key whose value comes next."""
    members, key = validator.envelope.members, validator._key
    return ("result" in members or key == "result"), ("error" in members or key == "error")


def _closing(validator: LineValidator) -> tuple[str, bool]:
    """The text that completes the value in progress and closes the containers inside the
    top-level object; whether that object then has a member."""
    expect, stack, in_key = validator._expect, validator._stack, validator._in_key
    if expect == _STRING:
        # A top-level key is closed as one no message has (an underscore added): ``"error``
        # closed as ``"error"`` would name a member the ending cannot take back.
        top_key = in_key and len(stack) == 1
        parts = ['_":null' if top_key else '":null' if in_key else '"']
    elif expect == _NUMBER_GOES_ON:
        parts = ["" if _NUMBER.fullmatch(validator._number_shape) else "0"]
    elif expect == _COLON:
        parts = [":null"]
    elif expect == _VALUE:
        parts = ["null"]
    elif expect == _KEY:
        parts = ['"":null']
    else:  # _FIRST_KEY, _FIRST_VALUE, _AFTER_VALUE: nothing is open
        parts = []
    parts.append(_closers(stack[1:]))
    empty_top = len(stack) == 1 and expect == _FIRST_KEY
    return "".join(parts), not empty_top


def judge(raw: bytes) -> tuple[Envelope, FrameError | None]:
    """A whole line judged without building its value: its envelope and None if it is
    valid JSON, else what was read of the envelope before the fault and the error (with
    the request's id when the line named one before its fault)."""
    validator = LineValidator()
    try:
        validator.feed(raw)
        return validator.finish(), None
    except FrameError as exc:
        error = exc
    envelope = validator.envelope
    fault = _first_byte_fault(raw)
    if fault is not None:
        # Bytes that are invalid wherever they are fail a piece before any of it is
        # judged: read the envelope up to them.
        validator = LineValidator()
        with contextlib.suppress(FrameError):
            validator.feed(raw[:fault])
        envelope = validator.envelope
    request_id = error.request_id if error.request_id is not None else envelope.request_id()
    return envelope, FrameError(error.code, error.message, request_id)


_BAD_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x0c\x0e-\x1f]")


def _first_byte_fault(raw: bytes) -> int | None:
    """Where the first byte that no valid line holds is: a control character other than
    tab and carriage return, or a byte that is not UTF-8."""
    control = _BAD_CONTROL.search(raw)
    fault = control.start() if control is not None else None
    try:
        raw.decode()
    except UnicodeDecodeError as exc:
        fault = exc.start if fault is None else min(fault, exc.start)
    return fault


def _scan_small(text: str, pos: int, *, long_look: bool = True) -> tuple[Any, int]:
    """json's C scanner on the value at ``pos`` if it is small: only a small value is worth
    building, so a larger one fails after a bounded look (and is entered instead, as is one
    holding an integer too long for int()). Without ``long_look``, only the short one: a
    container inside one found too long, where most are too long as well (each failed
    long look reads as much again)."""
    # A container with no closer of its kind within the look cannot end there: a scan would
    # read all of it to fail (the start of a long line: 64 KiB of its large string).
    closer = "}" if text[pos] == "{" else "]"
    if len(text) - pos <= _WHOLE_AT_ONCE:
        if text.find(closer, pos) < 0:
            raise ValueError("nothing closes it in the text held")
        return _scan_once(text, pos)
    for window in _SCAN_WINDOWS if long_look else _SCAN_WINDOWS[:1]:
        if text.find(closer, pos, pos + window) < 0:
            continue
        try:
            value, after = _scan_once(text[pos : pos + window], 0)
        except (ValueError, StopIteration):
            if window == _WHOLE_AT_ONCE:
                raise
            continue
        return value, after + pos
    raise ValueError("longer than the look")


def _string_end(data: bytes, decoder: codecs.IncrementalDecoder) -> int | None:
    """Where the string text at the start of ``data`` ends (its closing quote, or
    ``len(data)`` when it goes on), judged without decoding it; None when it holds escapes
    or ``decoder`` holds the start of a character split across pieces (judge it decoded).
    A span that is not ASCII is fed to ``decoder``, which keeps a split character."""
    if decoder.getstate()[0]:
        return None
    quote = data.find(b'"')
    stop = quote if quote >= 0 else len(data)
    if data.find(b"\\", 0, stop) >= 0:
        return None
    span = data if quote < 0 else data[:quote]
    if not span.isascii():
        try:
            decoder.decode(span)  # judged, not kept; a split character waits
        except UnicodeDecodeError as exc:
            raise _invalid(f"not UTF-8 ({exc.reason})") from None
        if quote >= 0 and decoder.getstate()[0]:
            raise _invalid("not UTF-8 (a character cut by a quote)")
    return stop


class _Runs(NamedTuple):
    """The plain run of openings or closings, the one that also takes flat items, and
    what, where the plain one stops, says a flat item may be next."""

    plain: re.Pattern[str]
    flat: re.Pattern[str]
    flat_next: re.Pattern[str]

    def match(self, text: str, pos: int, window: int) -> tuple[re.Match[str] | None, bool]:
        """The plain run at ``pos`` (within ``window``), or the longer flat one where the
        plain one stops short of the window at what may be a flat item; and whether it is
        the flat one."""
        run = self.plain.match(text, pos, window)
        end = pos if run is None else run.end()
        if end + _SHORT_OF_WINDOW < window and self.flat_next.match(text, end, window):
            longer = self.flat.match(text, pos, window)
            if longer is not None and longer.end() > end:
                return longer, True
        return run, False


def _openings_end(text: str, pos: int, window: int) -> int:
    """Where a run of openings from ``pos`` ends (within ``window``); ``pos`` for none."""
    run, _ = _OPENING_RUNS.match(text, pos, window)
    return pos if run is None else run.end()


_OPENING_RUNS: Final = _Runs(_OPENERS, _FLAT_OPENERS, _FLAT_NEXT)
_CLOSING_RUNS: Final = _Runs(_CLOSINGS, _FLAT_CLOSINGS, _FLAT_CLOSING_NEXT)


def _opened(text: str, pos: int, end: int) -> bytes:
    """The containers a run of openings from ``pos`` to ``end`` opens one inside the other
    (see :data:`_OPENER`), a byte each as the stack keeps them."""
    if text[end - 1] == "[" and text.count("[", pos, end) == end - pos:
        return bytes(end - pos)  # the usual run: brackets only
    # The run's strings hold no quote or backslash (its pattern's), so what lies between
    # two quotes is a string: split away, at a third of a substitution's cost.
    run = "".join(text[pos:end].split('"')[::2])
    if "]" in run or "}" in run:  # flat items: a closer is only ever one's
        run = _FLAT_TEXT.sub("", run)
    return run.encode("utf-8", "surrogatepass").translate(_CONTAINER_OF, _BETWEEN_OPENINGS)


def _closed(stack: bytearray, text: str, pos: int) -> int:
    """How many of the containers of ``stack`` below the top-level members the run of
    closers at ``pos`` closes rightly, innermost first."""
    run = _CLOSERS.match(text, pos)
    count = min(run.end() - pos, len(stack) - 2)  # type: ignore[union-attr]  # it matches
    expected = _closers(stack[-count:])
    closing = text[pos : pos + count]
    if closing == expected:
        return count
    # Up to a wrong closer, which is judged alone (and refused) next. Taking none then made
    # each level build the run again: a deep line with one wrong or missing closer cost its
    # depth squared.
    pairs = enumerate(zip(closing, expected, strict=True))
    return next(at for at, (got, want) in pairs if got != want)


def _open_run(validator: LineValidator, text: str, pos: int, end: int) -> int:
    """Enter the containers opened from ``pos`` to ``end`` (see :func:`_opened`)."""
    opened = _opened(text, pos, end)
    validator._stack += opened
    if validator._unscanned:
        validator._unscanned = max(1, validator._unscanned - len(opened))
    # Only an array opened last with no item yet may close at once.
    validator._expect = _FIRST_VALUE if text[pos:end].rstrip(" \t\r")[-1] == "[" else _VALUE
    return end


def _close_run(validator: LineValidator, text: str, pos: int) -> int:
    """Close containers below the top-level members at ``pos`` many at a time: how
    many characters were taken (0: none, the closing is judged one at a time)."""
    # Not inside an error object: its own members are judged one by one.
    taken, count = _closing_run(validator._stack, text, pos, items=validator._error is None)
    if count:
        del validator._stack[-count:]
        if len(validator._stack) <= validator._too_long_at:
            validator._too_long_at = -1
    return taken


def _items_run(validator: LineValidator, text: str, pos: int, final: bool) -> int:
    """Items or members of the container ``validator`` has open, from ``pos``, judged a
    run at a time (see :func:`_run_of_items`): the position after the comma that ends the
    run, ``pos`` when none is taken (they are walked one at a time), or -1 to wait for more
    text (after a run, the few items left in the text held are the next run's first)."""
    depth = len(validator._stack)
    if pos < validator._items_from:
        return pos
    if len(text) - pos < _ITEMS_AT_LEAST:
        return -1 if depth == validator._run_depth and not final else pos
    if depth == 2 and validator._error is not None:
        return pos  # the error object's members are judged one by one
    end = min(len(text), pos + _RUN_WINDOW)
    is_object = validator._stack[-1] == 1
    envelope = depth == 1 and is_object  # the top-level members
    if envelope:
        named = _ENVELOPE_KEY.search(text, pos, end)
        if named is not None:
            if named.start() - pos < _ITEMS_AT_LEAST:
                return pos  # walked up to it, and past it
            end = named.start()
    run = _run_of_items(text, pos, end, is_object)
    if run is None or (envelope and not _ENVELOPE_KEYS.isdisjoint(run[0])):
        # Not tried again within the window, whatever the containers do there: a try reads
        # up to the window's length, so the tries read the line's length at most.
        validator._items_from = end
        return pos
    if envelope:
        validator._top_members += len(run[0])
    validator._run_depth = depth
    validator._expect = _KEY if is_object else _VALUE
    return run[1] + 1


def _run_of_items(text: str, pos: int, end: int, is_object: bool) -> tuple[Any, int] | None:
    """The items (or members) of an array (or object) from ``pos`` to one of the last commas
    before ``end``, read by json's scanner as one container of their kind: its value and
    where that comma is; None when there are not many small items there, no such comma is
    found, the container closes before it, or the scanner refuses them.

    A comma is tried only where the text from ``pos`` has as many openings as closers and
    an even count of quotes (escaped ones aside): between two items as far as counting can
    tell. If it is inside a string or a nested container all the same, the text closed
    there is not one valid container (a string or a container is left open), so the
    scanner refuses it; if it is between items, the scanner judges them as the walk would.
    """
    cut = text.rfind(",", pos, end)
    if cut - pos < _ITEMS_AT_LEAST or text.count(",", pos, cut) < _ITEMS_COMMAS:
        return None  # not many small items: large ones, or deep nesting
    bracket = _BRACKET.search(text, pos, cut)
    if bracket is not None and bracket[0] in "]}":
        return None  # the container closes first
    depth, quotes = _balance(text, pos, cut)
    for _ in range(_ITEMS_CUTS):
        if depth == 0 and quotes % 2 == 0:
            break
        before = text.rfind(",", pos, cut)
        if before - pos < _ITEMS_AT_LEAST:
            return None
        opened, quoted = _balance(text, before, cut)
        depth, quotes, cut = depth - opened, quotes - quoted, before
    else:
        return None
    run = ("{" if is_object else "[") + text[pos:cut] + ("}" if is_object else "]")
    try:
        value, after = _scan_once(run, 0)
    except (ValueError, StopIteration, RecursionError):
        return None
    # Scanned short of the end: the container's closer came before the comma.
    return (value, cut) if after == len(run) else None


def _balance(text: str, start: int, end: int) -> tuple[int, int]:
    """How many more openings than closers ``text[start:end]`` holds, and how many quotes
    (escaped ones aside)."""
    count = text.count
    opened = count("[", start, end) + count("{", start, end)
    closed = count("]", start, end) + count("}", start, end)
    return opened - closed, count('"', start, end) - count('\\"', start, end)


def _closing_run(stack: bytearray, text: str, pos: int, *, items: bool) -> tuple[int, int]:
    """How many characters at ``pos`` a run of closings takes, and how many containers of
    ``stack`` it closes: bare closers the short way (:func:`_closed`); a run with spaces
    or items between its closers the long way (:func:`_closed_with_items`) if ``items``,
    else a closing at a time."""
    bare = _CLOSERS.match(text, pos).end()  # type: ignore[union-attr]  # it matches
    if items and _ITEM_NEXT.match(text, bare):
        taken, count = _closed_with_items(stack, text, pos)
        if count:
            return taken, count
    count = _closed(stack, text, pos)
    return count, count


def _closed_with_items(stack: bytearray, text: str, pos: int) -> tuple[int, int]:
    """How many characters at ``pos`` a run of closings with spaces or items between them
    (see :data:`_CLOSINGS`) takes, and how many containers of ``stack`` it closes: (0, 0)
    for a run of bare closers, which :func:`_closed` takes. Of a run that goes too far
    (to the top-level members), the closings before; of one that goes wrong (a wrong
    closer, an item of the wrong kind), the closings before the fault, read again one at
    a time; the fault is then judged the usual way (and ends the line)."""
    window = min(len(text), pos + _RUN_WINDOW)
    run, flat = _CLOSING_RUNS.match(text, pos, window)
    closing = _FLAT_CLOSING if flat else _CLOSING
    if run is None or not run.group().strip("]}"):
        return 0, 0
    count, fits = _closings_fit(stack, run.group())
    if fits:
        return run.end() - pos, count
    # The run's closings one by one (each is one of its repetitions).
    closings = closing.findall(text, pos, window)[: min(count, len(stack) - 2)]
    count, fits = _closings_fit(stack, "".join(closings))
    if fits:
        return sum(map(len, closings)), count
    count = 0
    while count < len(closings) and _closings_fit(stack, closings[count], count)[1]:
        count += 1
    return sum(map(len, closings[:count])), count


def _closings_fit(stack: bytearray, closings: str, closed: int = 0) -> tuple[int, bool]:
    """How many containers ``closings`` (closers with spaces or items between them)
    closes, and whether it closes that many of ``stack`` rightly (once its ``closed``
    innermost are closed), short of the top-level members: each closer the container's,
    each item of the kind its parent takes."""
    marks = _item_marks(closings)
    after = _CLOSER.split(marks)[1:]  # what follows each closer
    count = len(after)
    top = len(stack) - closed
    if not count or count > top - 2:
        return count, False
    closers = marks.replace("K", "").replace("V", "")
    # Each closer's items are its parent's: members in an object, items in an array.
    kinds = stack[top - count - 1 : top - 1][::-1].translate(_ITEMS_OF).decode("ascii")
    return count, closers == _closers(stack[top - count : top]) and _items_fit(after, kinds)


def _item_marks(closings: str) -> str:
    """``closings`` (a match of :data:`_CLOSINGS` or :data:`_FLAT_CLOSINGS`) as its
    closers, ``K`` for each member and ``V`` for each item."""
    if "[" in closings or "{" in closings:  # flat containers (or brackets in strings)
        closings = _FLAT_TEXT.sub("v", _STRING_TEXT.sub("v", closings))
    marks = _CLOSING_SPACE.sub("", _CLOSING_SCALAR.sub("v", closings))
    return marks.replace("v:v", "K").replace("v", "V")


def _items_fit(after: list[str], kinds: str) -> bool:
    """Whether the items after each closer (``after``) are all of the kind its parent
    takes (``kinds``: ``K`` or ``V`` per closer)."""
    return "".join(after) == "".join(map(str.__mul__, kinds, map(len, after)))


def _closers(stack: bytearray) -> str:
    """What closes the containers of ``stack`` (a slice of the validator's), innermost
    first."""
    return stack[::-1].translate(_CLOSER_OF).decode("ascii")


def _controls_in(data: bytes) -> tuple[bool, bool]:
    """Whether ``data`` holds a control byte no valid line holds raw, and whether it holds
    a tab or a carriage return (whitespace between tokens, invalid inside a string)."""
    if len(data) < _SEARCH_EACH_FROM:
        controls = data.translate(None, _NOT_CONTROL)
        return bool(controls.strip(_WHITESPACE_CONTROLS)), bool(controls)
    find = data.find
    if any(find(byte) >= 0 for byte in _OTHER_CONTROLS):
        return True, True
    return False, find(b"\t") >= 0 or find(b"\r") >= 0


def _scan_reach(held: int) -> int:
    """How far from where it started a failed :func:`_scan_small` read, given ``held``
    characters of text from there, for the containers inside to be entered without a scan.

    All of it when it read all the text held. When it only looked into a window: the
    short look's, even after a long look failed too. The containers inside a long look's
    window get only short looks, each starting past the last one that failed, and long
    looks never overlap (the next comes after this container closes, and it is longer than
    the window, or the line is not valid): each character is read by at most two failed
    scans, and a large container's first items are still scanned.
    """
    return held if held <= _WHOLE_AT_ONCE else _SCAN_WINDOWS[0]


def _escape_safe_cut(text: str, pos: int) -> int:
    """The last position from ``pos`` at which string text can be cut without splitting
    an escape (``\\x`` or ``\\uXXXX``) that may still be completed by the next piece."""
    cut = len(text)
    # Only an escape begun in the last five characters can be incomplete.
    backslash = text.rfind("\\", max(pos, cut - 6), cut)
    if backslash < 0:
        return cut
    if _backslashes_before(text, pos, backslash) % 2:
        return cut  # it is the escaped character of the backslash before it
    length = 6 if backslash + 1 < cut and text[backslash + 1] == "u" else 2
    return backslash if backslash + length > cut else cut


def _backslashes_before(text: str, pos: int, end: int) -> int:
    """How many backslashes run up to ``end`` (from ``pos`` at most), counted by the string
    methods: walked one by one, a string of backslashes cost a step per character at every
    piece (one of 2 MiB took 145 ms of CPU to judge, 26 ms counted so)."""
    near = text[max(pos, end - _NEAR_BACKSLASHES) : end]
    run = len(near) - len(near.rstrip("\\"))
    if run < _NEAR_BACKSLASHES or end - run <= pos:
        return run
    far = text[pos : end - run]
    return run + len(far) - len(far.rstrip("\\"))


# Where a run of backslashes is looked for first: the usual run is one or two long.
_NEAR_BACKSLASHES: Final = 32


_NUMBER_START: Final = frozenset("-0123456789")
_FRACTION: Final = re.compile(r"[.eE]")  # in a number's shape: not an integer
_LITERALS: Final = {"t": True, "f": False, "n": None}
# What ends a cut answer whose error object may be incomplete: the last of two members of
# one name wins, so this one is its error.
_CUT_ERROR: Final = ',"error":{"code":-32603,"message":"The answer was cut short."}'


def _shorten_digits(run: re.Match[str]) -> str:
    """A run of two or more digits as two: what its first digit is and that more follow
    is all a number's shape needs (a leading zero must stand alone)."""
    return run[0][0] + "1"


def _number_value(text: str) -> Any:
    if any(char in text for char in ".eE"):
        return float(text)
    return jsonrpc._parse_int(text)


def _member(key: str, value: Any) -> Any:
    """A top-level member as the envelope keeps it (see :class:`Envelope`)."""
    if key == "error" and type(value) is dict:
        return {name: _error_part(value[name]) for name in ("code", "message") if name in value}
    return _kept(value)


def _error_part(value: Any) -> Any:
    if isinstance(value, str):
        return ""
    if isinstance(value, (dict, list)):
        return type(value)()
    return value


def _kept(value: Any) -> Any:
    """A top-level member as the envelope keeps it: scalars as they are, else its type."""
    if isinstance(value, str) and len(value) > _SMALL:
        return Large(str)
    if value is None or isinstance(value, (str, int, float, bool, Large, jsonrpc.LongInteger)):
        return value
    return Large(type(value))


def _invalid(reason: str) -> FrameError:
    return FrameError(jsonrpc.PARSE_ERROR, f"The line is not valid JSON: {reason}.")
