"""The embedded local model endpoint: fake LLM APIs on 127.0.0.1 that record every request.

Real agents (claude-agent-acp, goose, codex-acp, gemini-cli, qwen-code) can be pointed at
it to run offline, and tests or ``acp-bridge verify`` then assert what the model received
in its system slot.
One endpoint serves every wire format at once, routed by path:

* Anthropic Messages: ``POST …/v1/messages`` (+ ``/count_tokens``)
* OpenAI Chat Completions: ``POST …/v1/chat/completions``
* OpenAI Responses: ``POST …/v1/responses``
* Gemini: ``POST …/models/<model>:streamGenerateContent`` (SSE), ``:generateContent``,
  ``:countTokens``
* ``GET …/v1/models`` and ``HEAD /`` for clients that probe first.
"""

from acp_bridge.model_endpoint.records import (
    Flavour,
    Kind,
    RecordedRequest,
    classify,
    parse_request,
    read_log,
)
from acp_bridge.model_endpoint.replies import DEFAULT_REPLY, DEFAULT_TITLE, Reply, reply_for
from acp_bridge.model_endpoint.server import (
    MAX_BODY_SIZE,
    ModelEndpoint,
    RequestLog,
    ThreadedModelEndpoint,
    open_model_endpoint,
)

__all__ = [
    "DEFAULT_REPLY",
    "DEFAULT_TITLE",
    "MAX_BODY_SIZE",
    "Flavour",
    "Kind",
    "ModelEndpoint",
    "RecordedRequest",
    "Reply",
    "RequestLog",
    "ThreadedModelEndpoint",
    "classify",
    "open_model_endpoint",
    "parse_request",
    "read_log",
    "reply_for",
]
