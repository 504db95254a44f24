"""What the model received: one recorded HTTP request, classified, with its system slot.

This module owns the meaning of a request body, sans-IO. It decides which API flavour a
request speaks (Anthropic Messages, OpenAI Chat Completions, OpenAI Responses, Gemini
``generateContent``), whether it
is the agent's main model call or a side call (session title, prompt suggestion, token
count), and how to read the system slot of each flavour as text. The server only feeds it
method, path, headers and the parsed body.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

Flavour = Literal["anthropic", "openai-chat", "openai-responses", "gemini", "other"]
Kind = Literal["main", "title", "suggestion", "count_tokens", "other"]

FLAVOURS: Final[tuple[Flavour, ...]] = (
    "anthropic",
    "openai-chat",
    "openai-responses",
    "gemini",
    "other",
)

# Gemini methods are a suffix of the model's path segment: ``models/<m>:<method>``.
GEMINI_GENERATE: Final = (":streamGenerateContent", ":generateContent")
GEMINI_COUNT_TOKENS: Final = ":countTokens"

# Side calls newer Claude Code CLIs make on /v1/messages besides the agent's turn. They
# are recognised by fixed texts the CLI puts in them: the title call has its own system
# prompt, the suggestion call reuses the main system prompt and ends with this request.
TITLE_SYSTEM_MARKERS: Final = ("You are naming a coding session",)
# opencode's session-title call on /chat/completions (its hidden ``title`` agent); it
# carries the user's text like the main call, so only its system prompt tells it apart.
CHAT_TITLE_SYSTEM_STARTS: Final = ("You are a title generator.",)
SUGGESTION_USER_MARKERS: Final = ("Reply with ONLY the suggestion",)

# Credentials are kept only as a short prefix: enough to tell which key a client sent,
# never enough to reuse one if a real key reaches the endpoint or its log file.
SECRET_HEADERS: Final = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
SECRET_PREFIX_CHARS: Final = 10


def redact_header(name: str, value: str) -> str:
    """Keep a credential header recognisable without keeping the credential."""
    if name.lower() not in SECRET_HEADERS or len(value) <= SECRET_PREFIX_CHARS:
        return value
    return value[:SECRET_PREFIX_CHARS] + "..."


def split_target(target: str) -> tuple[str, str]:
    """Split a request target into path (no trailing slash except ``/``) and query."""
    path, _, query = target.partition("?")
    if len(path) > 1:
        path = path.rstrip("/") or "/"
    return path, query


def classify(method: str, path: str, headers: Mapping[str, str], body: Any) -> tuple[Flavour, Kind]:
    """Say which API a request speaks and what it is for.

    Routing is by path suffix so that any base URL prefix works (``/v1``, ``/api/v1``,
    none). ``/models`` is shared by all three APIs; it counts as Anthropic only when the
    client says so with its ``anthropic-version`` header.
    """
    method = method.upper()
    if path.endswith(GEMINI_COUNT_TOKENS):
        return "gemini", "count_tokens"
    if path.endswith(GEMINI_GENERATE):
        if method != "POST":
            return "gemini", "other"
        return "gemini", _gemini_kind(body)
    if path.endswith("/messages/count_tokens"):
        return "anthropic", "count_tokens"
    if path.endswith("/messages"):
        if method != "POST":
            return "anthropic", "other"
        return "anthropic", _anthropic_kind(body)
    if path.endswith("/chat/completions"):
        return "openai-chat", _chat_kind(body) if method == "POST" else "other"
    if path.endswith("/responses"):
        # Codex probes GET /responses for a WebSocket upgrade before using HTTP POST.
        return "openai-responses", "main" if method == "POST" else "other"
    if "anthropic-version" in headers:
        return "anthropic", "other"
    return "other", "other"


def _anthropic_kind(body: Any) -> Kind:
    if not isinstance(body, dict):
        return "other"
    system = "\n\n".join(_anthropic_system_blocks(body.get("system")))
    if any(marker in system for marker in TITLE_SYSTEM_MARKERS):
        return "title"
    users = _message_texts(body.get("messages"), roles=("user",), part_types=("text",))
    if users and any(marker in users[-1] for marker in SUGGESTION_USER_MARKERS):
        return "suggestion"
    return "main"


def _chat_kind(body: Any) -> Kind:
    if not isinstance(body, dict):
        return "main"
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    if isinstance(first, dict) and first.get("role") == "system":
        system = content_text(first.get("content"))
        if system.startswith(CHAT_TITLE_SYSTEM_STARTS):
            return "title"
    return "main"


def _gemini_kind(body: Any) -> Kind:
    """gemini-cli's own side calls (routing classifier, next-speaker check, ...) ask for a
    JSON answer; the agent's turn does not."""
    if not isinstance(body, dict):
        return "other"
    config = body.get("generationConfig")
    if isinstance(config, dict) and (
        config.get("responseMimeType") == "application/json"
        or "responseJsonSchema" in config
        or "responseSchema" in config
    ):
        return "other"
    return "main"


def gemini_parts_text(content: Any) -> str:
    """Text of a Gemini ``Content`` (``{role, parts: [{text}]}``) or a bare string.

    Parts are concatenated without a separator: that is how the model reads them.
    """
    if isinstance(content, str):
        return content
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return ""
    return "".join(
        part["text"]
        for part in parts
        if isinstance(part, dict) and isinstance(part.get("text"), str) and not part.get("thought")
    )


def content_text(content: Any, part_types: Iterable[str] = ("text",)) -> str:
    """Text of a message ``content``: a string, or the text parts of a list, joined.

    Every flavour allows both shapes: Anthropic ``[{type: text}]``, Chat Completions
    ``[{type: text}]``, Responses ``[{type: input_text}]``. Non-text parts (images, tool
    results) are not part of what this endpoint asserts on and are skipped.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    wanted = tuple(part_types)
    texts = [
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") in wanted
        and isinstance(part.get("text"), str)
    ]
    return "\n\n".join(texts)


def _anthropic_system_blocks(system: Any) -> list[str]:
    if isinstance(system, str):
        return [system] if system else []
    if not isinstance(system, list):
        return []
    return [
        block["text"]
        for block in system
        if isinstance(block, dict)
        and block.get("type", "text") == "text"
        and isinstance(block.get("text"), str)
    ]


def _message_texts(messages: Any, roles: tuple[str, ...], part_types: tuple[str, ...]) -> list[str]:
    """One text per message whose role is in ``roles``, in order, skipping empty ones."""
    if not isinstance(messages, list):
        return []
    out = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in roles:
            continue
        # Responses input items carry ``type: message``; items of other types (function
        # calls, reasoning) have no role and were skipped above.
        text = content_text(message.get("content"), part_types)
        if text:
            out.append(text)
    return out


_RESPONSES_PARTS: Final = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request as the endpoint received it.

    ``headers`` has lower-case names (repeated headers joined with ``", "``) and
    credentials shortened. ``body`` is the parsed JSON body, or ``None`` when there was
    none or it was not JSON (then ``body_error`` says why).
    """

    seq: int
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    timestamp: float
    flavour: Flavour
    kind: Kind
    body_error: str | None = None
    body_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    # -- generic ---------------------------------------------------------------------

    @property
    def is_main(self) -> bool:
        """The agent's own model turn, as opposed to side calls and probes."""
        return self.kind == "main"

    @property
    def model(self) -> str | None:
        value = self.body.get("model") if isinstance(self.body, dict) else None
        return value if isinstance(value, str) else None

    @property
    def stream(self) -> bool:
        if self.flavour == "gemini":
            return self.path.endswith(":streamGenerateContent")
        return isinstance(self.body, dict) and self.body.get("stream") is True

    def _field(self, name: str) -> Any:
        return self.body.get(name) if isinstance(self.body, dict) else None

    # -- the system slot -------------------------------------------------------------

    @property
    def instructions(self) -> str | None:
        """Responses ``instructions``: the base instructions (``None`` if absent)."""
        value = self._field("instructions")
        return value if isinstance(value, str) else None

    def system_blocks(self) -> list[str]:
        """Every text the model gets in its system/developer slot, in wire order.

        * Anthropic: the ``system`` string, or the text of each ``system`` block.
        * Chat Completions: each ``system`` or ``developer`` message.
        * Responses: ``instructions``, then each ``system``/``developer`` input message.
        * Gemini: the text of ``systemInstruction``.
        """
        if self.flavour == "gemini":
            text = gemini_parts_text(self._field("systemInstruction"))
            return [text] if text else []
        if self.flavour == "anthropic":
            return _anthropic_system_blocks(self._field("system"))
        if self.flavour == "openai-chat":
            return _message_texts(self._field("messages"), ("system", "developer"), ("text",))
        if self.flavour == "openai-responses":
            head = [self.instructions] if self.instructions else []
            return head + _message_texts(
                self._input_items(), ("system", "developer"), _RESPONSES_PARTS
            )
        return []

    def system_text(self) -> str:
        """:meth:`system_blocks` joined with blank lines; ``""`` when the slot is empty."""
        return "\n\n".join(self.system_blocks())

    def developer_texts(self) -> list[str]:
        """Texts of developer-role messages (Chat Completions and Responses), in order.

        Codex puts ``developer_instructions`` here as its own ``input_text`` part, so each
        part is one entry, not each message.
        """
        if self.flavour == "openai-chat":
            return _message_texts(self._field("messages"), ("developer",), ("text",))
        if self.flavour != "openai-responses":
            return []
        out: list[str] = []
        for item in self._input_items():
            if not isinstance(item, dict) or item.get("role") != "developer":
                continue
            content = item.get("content")
            if isinstance(content, str):
                out.append(content)
                continue
            for part in content if isinstance(content, list) else []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out.append(part["text"])
        return out

    def user_texts(self) -> list[str]:
        """Texts of user-role messages, one per message, in order."""
        if self.flavour == "anthropic":
            return _message_texts(self._field("messages"), ("user",), ("text",))
        if self.flavour == "openai-chat":
            return _message_texts(self._field("messages"), ("user",), ("text",))
        if self.flavour == "openai-responses":
            return _message_texts(self._input_items(), ("user",), _RESPONSES_PARTS)
        if self.flavour == "gemini":
            contents = self._field("contents")
            texts = [
                gemini_parts_text(item)
                for item in (contents if isinstance(contents, list) else [])
                if isinstance(item, dict) and item.get("role", "user") == "user"
            ]
            return [text for text in texts if text]
        return []

    def last_user_text(self) -> str:
        users = self.user_texts()
        return users[-1] if users else ""

    def _input_items(self) -> list[Any]:
        value = self._field("input")
        if isinstance(value, str):
            # A bare string input is shorthand for one user message.
            return [{"role": "user", "content": value}]
        return value if isinstance(value, list) else []

    # -- serialisation ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object, one line of the endpoint's log file."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "t": self.timestamp,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "flavour": self.flavour,
            "kind": self.kind,
            "headers": self.headers,
            "body": self.body,
            "body_size": self.body_size,
        }
        if self.body_error is not None:
            out["body_error"] = self.body_error
        if self.extra:
            out["extra"] = self.extra
        return out

    def to_json_line(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordedRequest:
        """Read back a log line written by :meth:`to_json` (e.g. by another process)."""
        return cls(
            seq=int(data["seq"]),
            method=str(data["method"]),
            path=str(data["path"]),
            query=str(data.get("query", "")),
            headers=dict(data.get("headers", {})),
            body=data.get("body"),
            timestamp=float(data["t"]),
            flavour=_as_flavour(data.get("flavour")),
            kind=_as_kind(data.get("kind")),
            body_error=data.get("body_error"),
            body_size=int(data.get("body_size", 0)),
            extra=dict(data.get("extra", {})),
        )


def _as_flavour(value: Any) -> Flavour:
    for flavour in FLAVOURS:
        if value == flavour:
            return flavour
    return "other"


def _as_kind(value: Any) -> Kind:
    kinds: tuple[Kind, ...] = ("main", "title", "suggestion", "count_tokens", "other")
    for kind in kinds:
        if value == kind:
            return kind
    return "other"


def read_log(lines: Iterable[str]) -> list[RecordedRequest]:
    """Parse a JSON-lines log written by the endpoint, skipping blank lines."""
    return [RecordedRequest.from_json(json.loads(line)) for line in lines if line.strip()]


class BodyTooLarge(Exception):
    """The body, as sent or once decompressed, is over the endpoint's limit."""


def decode_body(raw: bytes, content_encoding: str, limit: int) -> bytes:
    """Undo ``gzip``/``deflate`` content coding without ever holding more than ``limit``.

    Raises :class:`ValueError` for a coding this endpoint does not speak (e.g. ``zstd``)
    or a corrupt stream, and :class:`BodyTooLarge` for a decompression bomb.
    """
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise ValueError(f"unsupported content-encoding: {content_encoding}")
    import zlib

    # wbits: 16+ accepts a gzip header, 32+ auto-detects zlib or gzip.
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS if "gzip" in coding else 32 + zlib.MAX_WBITS)
    try:
        out = decoder.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"corrupt {coding} body: {exc}") from exc
    if len(out) > limit or decoder.unconsumed_tail:
        raise BodyTooLarge(f"decoded body over {limit} bytes")
    return out


def parse_request(
    *,
    seq: int,
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    raw_body: bytes,
    timestamp: float,
    limit: int,
) -> RecordedRequest:
    """Build the record for one complete request; never raises for a bad body.

    A body that cannot be read as JSON is kept out of ``body`` and explained in
    ``body_error``, so the reply can be a 400 and the log still shows the attempt.
    """
    header_map: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.lower()
        value = redact_header(name, raw_value)
        header_map[name] = f"{header_map[name]}, {value}" if name in header_map else value
    path, query = split_target(target)
    body: Any = None
    error: str | None = None
    if raw_body:
        try:
            decoded = decode_body(raw_body, header_map.get("content-encoding", ""), limit)
        except (ValueError, BodyTooLarge) as exc:
            error = str(exc)
        else:
            try:
                body = json.loads(decoded)
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
                error = f"body is not valid JSON: {exc}"
    flavour, kind = classify(method, path, header_map, body)
    return RecordedRequest(
        seq=seq,
        method=method.upper(),
        path=path,
        query=query,
        headers=header_map,
        body=body,
        timestamp=timestamp,
        flavour=flavour,
        kind=kind,
        body_error=error,
        body_size=len(raw_body),
    )
