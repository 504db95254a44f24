"""What the endpoint answers, sans-IO: one :class:`Reply` per recorded request.

Each flavour's streaming format follows what the real CLIs parse (measured on
claude-agent-acp 0.23.1, goose 1.52.0 and codex-acp 0.16.0), no more:

* Anthropic Messages: ``message_start`` → ``content_block_start`` → ``ping`` →
  ``content_block_delta`` (n times) → ``content_block_stop`` → ``message_delta`` → ``message_stop``.
* Chat Completions: ``data:`` chunks (role + content, finish_reason, usage) then
  ``data: [DONE]``.
* Responses: ``response.created`` → ``response.output_item.added`` →
  ``response.output_text.delta`` (n times) → ``response.output_item.done`` → ``response.completed``.
  Codex only finishes a turn when the stream ends, so every stream closes the connection.
* Gemini ``streamGenerateContent?alt=sse``: ``data:`` chunks, each a whole
  ``GenerateContentResponse``, the last with ``finishReason`` and ``usageMetadata``
  (measured on gemini-cli 0.61.0). Its side calls ask for JSON and get one object that
  satisfies each of its parsers (routing classifier, next-speaker check).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from acp_bridge.model_endpoint.records import RecordedRequest

DEFAULT_REPLY: Final = "acp-bridge model endpoint reply"
DEFAULT_TITLE: Final = "acp-bridge session"
MODEL_IDS: Final = ("claude-sonnet-4-6", "gpt-5.4", "fake-model")

# Streams are split into a few deltas so clients exercise their accumulation code, but
# not so many that a long reply floods the test with events.
DELTA_COUNT: Final = 3

USAGE_INPUT_TOKENS: Final = 10
USAGE_OUTPUT_TOKENS: Final = 5


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status, content type and body pieces sent in order.

    ``stream`` marks a server-sent-events body: sent piece by piece, without a length,
    and followed by closing the connection.
    """

    status: int
    content_type: str
    chunks: tuple[bytes, ...]
    stream: bool = False
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def json_reply(status: int, obj: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, "application/json", (json.dumps(obj).encode(),), headers=headers)


def error_reply(status: int, error_type: str, message: str) -> Reply:
    """An error both SDK families can read: Anthropic's envelope, OpenAI's ``error.message``."""
    return json_reply(status, {"type": "error", "error": {"type": error_type, "message": message}})


def split_text(text: str, pieces: int = DELTA_COUNT) -> list[str]:
    """Cut ``text`` into at most ``pieces`` non-empty consecutive parts (one for ``""``)."""
    if not text:
        return [""]
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def reply_for(request: RecordedRequest, text: str, title: str = DEFAULT_TITLE) -> Reply:
    """The answer to ``request``; ``text`` is what the model "says" on a main call."""
    if request.method in ("GET", "HEAD"):
        return _get_reply(request)
    if request.method != "POST":
        return error_reply(405, "invalid_request_error", f"method {request.method} not allowed")
    if request.body_error is not None:
        return error_reply(400, "invalid_request_error", request.body_error)
    if request.flavour != "other" and not isinstance(request.body, dict):
        return error_reply(400, "invalid_request_error", "request body must be a JSON object")
    if request.flavour == "gemini" and request.kind == "count_tokens":
        return json_reply(200, {"totalTokens": USAGE_INPUT_TOKENS})
    if request.kind == "count_tokens":
        size = len(json.dumps(request.body))
        return json_reply(200, {"input_tokens": max(1, size // 4)})
    seq = request.seq
    if request.flavour == "anthropic" and request.kind != "other":
        if request.kind == "title":
            # The CLI parses the title call's text as JSON and wants a ``title`` key.
            text = json.dumps({"title": title})
        return anthropic_reply(request, text, seq)
    if request.flavour == "openai-chat" and request.kind == "title":
        return chat_reply(request, title, seq)
    if request.flavour == "openai-chat" and request.kind == "main":
        return chat_reply(request, text, seq)
    if request.flavour == "openai-responses" and request.kind == "main":
        return responses_reply(request, text, seq)
    if request.flavour == "gemini":
        return gemini_reply(request, text if request.kind == "main" else GEMINI_SIDE_ANSWER)
    return error_reply(404, "not_found_error", f"no such endpoint: POST {request.path}")


def _get_reply(request: RecordedRequest) -> Reply:
    if request.path == "/":
        # Claude Code preconnects with HEAD / and only needs a 2xx.
        return json_reply(200, {"name": "acp-bridge model endpoint"})
    if request.path.endswith("/models"):
        return json_reply(200, models_listing())
    head, _, last = request.path.rpartition("/")
    if head.endswith("/models"):
        return json_reply(200, _model_object(last))
    return error_reply(404, "not_found_error", f"no such endpoint: {request.method} {request.path}")


def _model_object(model_id: str) -> dict[str, Any]:
    # One object in the shape of both APIs: Anthropic reads type/display_name/created_at,
    # OpenAI reads object/created/owned_by.
    return {
        "id": model_id,
        "type": "model",
        "display_name": model_id,
        "created_at": "2025-01-01T00:00:00Z",
        "object": "model",
        "created": 0,
        "owned_by": "acp-bridge",
    }


def models_listing() -> dict[str, Any]:
    """``GET /models`` for every client at once.

    Anthropic and OpenAI read ``data``; Codex reads ``models`` and, given an empty list,
    falls back to its bundled catalogue, which is what a custom provider needs.
    """
    data = [_model_object(model_id) for model_id in MODEL_IDS]
    return {
        "object": "list",
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"],
        "last_id": data[-1]["id"],
        "models": [],
    }


# -- Anthropic Messages ------------------------------------------------------------------


def anthropic_reply(request: RecordedRequest, text: str, seq: int) -> Reply:
    model = request.model or MODEL_IDS[0]
    message_id = f"msg_acpbridge_{seq:06d}"
    usage = {
        "input_tokens": USAGE_INPUT_TOKENS,
        "output_tokens": USAGE_OUTPUT_TOKENS,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    headers = (("request-id", f"req_acpbridge_{seq:06d}"),)
    if not request.stream:
        return json_reply(
            200,
            {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": usage,
            },
            headers,
        )
    return Reply(
        200,
        "text/event-stream",
        tuple(_anthropic_events(model, message_id, text, usage)),
        True,
        headers,
    )


def _anthropic_events(
    model: str, message_id: str, text: str, usage: dict[str, int]
) -> Iterator[bytes]:
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    yield sse({"type": "message_start", "message": start}, "message_start")
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    yield sse(block, "content_block_start")
    yield sse({"type": "ping"}, "ping")
    for piece in split_text(text):
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": piece},
        }
        yield sse(delta, "content_block_delta")
    yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    end = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": usage["output_tokens"]},
    }
    yield sse(end, "message_delta")
    yield sse({"type": "message_stop"}, "message_stop")


# -- OpenAI Chat Completions -------------------------------------------------------------


def chat_reply(request: RecordedRequest, text: str, seq: int) -> Reply:
    model = request.model or "fake-model"
    completion_id = f"chatcmpl-acpbridge-{seq:06d}"
    created = int(request.timestamp)
    usage = {
        "prompt_tokens": USAGE_INPUT_TOKENS,
        "completion_tokens": USAGE_OUTPUT_TOKENS,
        "total_tokens": USAGE_INPUT_TOKENS + USAGE_OUTPUT_TOKENS,
    }
    if not request.stream:
        message = {"role": "assistant", "content": text}
        return json_reply(
            200,
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            },
        )
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    chunks: list[bytes] = []
    for i, piece in enumerate(split_text(text)):
        delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
        chunks.append(
            sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        )
    chunks.append(sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    options = request.body.get("stream_options") if isinstance(request.body, dict) else None
    if isinstance(options, dict) and options.get("include_usage"):
        chunks.append(sse({**base, "choices": [], "usage": usage}))
    chunks.append(b"data: [DONE]\n\n")
    return Reply(200, "text/event-stream", tuple(chunks), True)


# -- OpenAI Responses --------------------------------------------------------------------


def responses_reply(request: RecordedRequest, text: str, seq: int) -> Reply:
    model = request.model or "gpt-5.4"
    response_id = f"resp_acpbridge_{seq:06d}"
    item_id = f"msg_acpbridge_{seq:06d}"
    usage = {
        "input_tokens": USAGE_INPUT_TOKENS,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": USAGE_OUTPUT_TOKENS,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": USAGE_INPUT_TOKENS + USAGE_OUTPUT_TOKENS,
    }
    item = {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    completed = {
        "id": response_id,
        "object": "response",
        "created_at": int(request.timestamp),
        "model": model,
        "status": "completed",
        "output": [item],
        "usage": usage,
    }
    if not request.stream:
        return json_reply(200, {**completed, "output_text": text})
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": {**completed, "status": "in_progress", "output": [], "usage": None},
        },
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
    ]
    for piece in split_text(text):
        events.append(
            {
                "type": "response.output_text.delta",
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
            }
        )
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    events.append({"type": "response.completed", "response": completed})
    numbered = [{**event, "sequence_number": n} for n, event in enumerate(events)]
    return Reply(200, "text/event-stream", tuple(sse(e, e["type"]) for e in numbered), True)


# -- Gemini generateContent --------------------------------------------------------------

# gemini-cli's side calls want JSON: the model router reads ``model_choice`` (and a
# reasoning text), the next-speaker check reads ``next_speaker``. "user" ends the turn.
GEMINI_SIDE_ANSWER: Final = json.dumps(
    {"reasoning": "acp-bridge model endpoint", "model_choice": "flash", "next_speaker": "user"}
)
GEMINI_MODEL: Final = "gemini-2.5-flash"


def gemini_reply(request: RecordedRequest, text: str) -> Reply:
    usage = {
        "promptTokenCount": USAGE_INPUT_TOKENS,
        "candidatesTokenCount": USAGE_OUTPUT_TOKENS,
        "totalTokenCount": USAGE_INPUT_TOKENS + USAGE_OUTPUT_TOKENS,
    }

    def chunk(piece: str, last: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {
            "content": {"role": "model", "parts": [{"text": piece}]},
            "index": 0,
        }
        response: dict[str, Any] = {"candidates": [candidate], "modelVersion": GEMINI_MODEL}
        if last:
            candidate["finishReason"] = "STOP"
            response["usageMetadata"] = usage
        return response

    if not request.stream:
        return json_reply(200, chunk(text, True))
    pieces = split_text(text)
    events = [sse(chunk(piece, i == len(pieces) - 1)) for i, piece in enumerate(pieces)]
    return Reply(200, "text/event-stream", tuple(events), True)
