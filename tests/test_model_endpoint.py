"""The embedded model endpoint, driven by a real HTTP client over loopback.

The client is h11 on a raw trio socket, so each test sees exactly the bytes and the
connection behaviour an agent's HTTP stack would see.
"""

from __future__ import annotations

import gzip
import http.client
import json
import math
import socket
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

from acp_bridge.model_endpoint import (
    MAX_BODY_SIZE,
    ModelEndpoint,
    RecordedRequest,
    ThreadedModelEndpoint,
    open_model_endpoint,
    parse_request,
    read_log,
)

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 10


# -- a small h11 client ------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def sse(self) -> list[tuple[str | None, Any]]:
        """(event name, parsed data) per server-sent event; ``[DONE]`` stays a string."""
        out: list[tuple[str | None, Any]] = []
        for block in self.body.decode().split("\n\n"):
            if not block.strip():
                continue
            name: str | None = None
            data = ""
            for line in block.split("\n"):
                if line.startswith("event: "):
                    name = line[len("event: ") :]
                elif line.startswith("data: "):
                    data += line[len("data: ") :]
            out.append((name, data if data == "[DONE]" else json.loads(data)))
        return out


class Client:
    """One HTTP/1.1 connection to the endpoint."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int) -> Client:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send_head(
        self, method: str, target: str, body: bytes | None, headers: list[tuple[str, str]]
    ) -> None:
        all_headers = [("host", "127.0.0.1"), *headers]
        if body is not None and not any(n.lower() == "content-length" for n, _ in headers):
            all_headers.append(("content-length", str(len(body))))
        await self.stream.send_all(
            self.conn.send(h11.Request(method=method, target=target, headers=all_headers))
        )

    async def request(
        self,
        method: str,
        target: str,
        payload: Any = None,
        *,
        raw: bytes | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> Answer:
        body = (
            raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
        )
        hdrs = list(headers or [])
        if payload is not None:
            hdrs.append(("content-type", "application/json"))
        await self.send_head(method, target, body, hdrs)
        if body:
            await self.stream.send_all(self.conn.send(h11.Data(data=body)))
        await self.stream.send_all(self.conn.send(h11.EndOfMessage()))
        return await self.read_answer()

    async def next_event(self) -> h11.Event:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            assert isinstance(event, h11.Event)
            return event

    async def read_answer(self) -> Answer:
        event = await self.next_event()
        assert isinstance(event, h11.Response), event
        status = event.status_code
        headers = {n.decode(): v.decode() for n, v in event.headers}
        chunks: list[bytes] = []
        while not isinstance(event := await self.next_event(), h11.EndOfMessage):
            assert isinstance(event, h11.Data)
            chunks.append(bytes(event.data))
        return Answer(status, headers, b"".join(chunks))

    async def server_closed(self) -> bool:
        """True once the server has closed its side (read returns EOF)."""
        return await self.stream.receive_some(65536) == b""

    async def aclose(self) -> None:
        await self.stream.aclose()


async def call(
    endpoint: ModelEndpoint, method: str, target: str, payload: Any = None, **kw: Any
) -> Answer:
    client = await Client.connect(endpoint.port)
    try:
        return await client.request(method, target, payload, **kw)
    finally:
        await client.aclose()


# -- realistic request bodies ------------------------------------------------------------

ANTHROPIC_SYSTEM: list[dict[str, Any]] = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.83.c50;"},
    {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "preset text\n\nMARKER-APPEND-123"},
]


def anthropic_body(stream: bool, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 32000,
        "stream": stream,
        "system": ANTHROPIC_SYSTEM,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                    {"type": "text", "text": "Say hello."},
                ],
            }
        ],
        "tools": [],
        **extra,
    }


def chat_body(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "fake-model",
        "stream": stream,
        "messages": [
            {"role": "system", "content": "goose base\n\n# Additional Instructions:\n\nMARKER-G"},
            {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
        ],
        "tools": [],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def responses_body(stream: bool) -> dict[str, Any]:
    return {
        "model": "gpt-5.4",
        "instructions": "MARKER-OVERRIDE-456",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [
                    {"type": "input_text", "text": "<permissions instructions>"},
                    {"type": "input_text", "text": "MARKER-DEV-123"},
                ],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "<environment_context/>"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
        "stream": stream,
        "store": False,
    }


# -- Anthropic Messages ------------------------------------------------------------------


async def test_anthropic_stream_sends_claude_event_sequence_and_records_system() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="hello from the model") as endpoint:
            answer = await call(
                endpoint,
                "POST",
                "/v1/messages?beta=true",
                anthropic_body(stream=True),
                headers=[
                    ("x-api-key", "sk-ant-fake-local-key"),
                    ("anthropic-version", "2023-06-01"),
                ],
            )
            assert answer.status == 200
            assert answer.headers["content-type"] == "text/event-stream"
            events = answer.sse()
            names = [name for name, _ in events]
            deltas = names.count("content_block_delta")
            assert deltas >= 1
            assert names == [
                "message_start",
                "content_block_start",
                "ping",
                *["content_block_delta"] * deltas,
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
            assert all(data["type"] == name for name, data in events)
            assert "usage" in events[0][1]["message"]
            text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
            assert text == "hello from the model"
            assert events[-2][1]["delta"]["stop_reason"] == "end_turn"

            (req,) = endpoint.main_requests("anthropic")
            assert (req.method, req.path, req.query) == ("POST", "/v1/messages", "beta=true")
            assert req.flavour == "anthropic" and req.kind == "main" and req.stream
            assert req.system_blocks() == [block["text"] for block in ANTHROPIC_SYSTEM]
            assert req.system_text().endswith("MARKER-APPEND-123")
            assert req.user_texts() == ["<system-reminder>ctx</system-reminder>\n\nSay hello."]
            assert req.headers["anthropic-version"] == "2023-06-01"
            assert req.headers["x-api-key"] == "sk-ant-fak..."  # credentials are shortened


async def test_anthropic_non_stream_answers_one_message_object() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="plain") as endpoint:
            answer = await call(endpoint, "POST", "/v1/messages", anthropic_body(stream=False))
            message = answer.json()
            assert answer.headers["content-type"] == "application/json"
            assert message["type"] == "message" and message["stop_reason"] == "end_turn"
            assert message["content"] == [{"type": "text", "text": "plain"}]
            assert endpoint.main_requests()[0].system_text().endswith("MARKER-APPEND-123")


async def test_anthropic_string_system_is_one_block() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            await call(endpoint, "POST", "/v1/messages", anthropic_body(False, system="OVERRIDE"))
            (req,) = endpoint.main_requests()
            assert req.system_blocks() == ["OVERRIDE"]
            assert req.system_text() == "OVERRIDE"


async def test_title_call_answers_json_title_and_is_not_main() -> None:
    body = anthropic_body(
        stream=True,
        system=[{"type": "text", "text": "You are naming a coding session. Reply in JSON."}],
    )
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(delay=math.inf, title="Greeting") as endpoint:
            # delay only holds main calls: the side call must still answer at once.
            answer = await call(endpoint, "POST", "/v1/messages", body)
            text = "".join(
                d["delta"]["text"] for n, d in answer.sse() if n == "content_block_delta"
            )
            assert json.loads(text) == {"title": "Greeting"}
            assert [r.kind for r in endpoint.requests] == ["title"]
            assert endpoint.main_requests() == []


async def test_suggestion_call_is_classified_apart_from_main() -> None:
    body = anthropic_body(False)
    body["messages"].append(
        {"role": "user", "content": "What would the user type next? Reply with ONLY the suggestion"}
    )
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            await call(endpoint, "POST", "/v1/messages", body)
            assert [r.kind for r in endpoint.requests] == ["suggestion"]
            assert endpoint.requests[0].system_text().endswith("MARKER-APPEND-123")


async def test_count_tokens_and_models_listing() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            counted = await call(
                endpoint, "POST", "/v1/messages/count_tokens", anthropic_body(False)
            )
            assert counted.json()["input_tokens"] > 0
            models = (await call(endpoint, "GET", "/v1/models")).json()
            assert models["data"] and models["models"] == []  # Anthropic/OpenAI and Codex
            one = (await call(endpoint, "GET", "/v1/models/claude-sonnet-4-6")).json()
            assert one["id"] == "claude-sonnet-4-6"
            assert [r.kind for r in endpoint.requests] == ["count_tokens", "other", "other"]


# -- OpenAI Chat Completions -------------------------------------------------------------


async def test_chat_stream_sends_chunks_usage_and_done() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="goose says hi") as endpoint:
            answer = await call(endpoint, "POST", "/v1/chat/completions", chat_body(stream=True))
            assert answer.headers["content-type"] == "text/event-stream"
            events = answer.sse()
            assert all(name is None for name, _ in events)
            assert events[-1][1] == "[DONE]"
            chunks = [data for _, data in events[:-1]]
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            text = "".join(
                c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]
            )
            assert text == "goose says hi"
            finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
            assert finishes[-1] == "stop"
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0

            (req,) = endpoint.main_requests("openai-chat")
            assert req.system_text() == "goose base\n\n# Additional Instructions:\n\nMARKER-G"
            assert req.user_texts() == ["Say hello."]
            assert req.developer_texts() == []


async def test_chat_stream_without_include_usage_has_no_usage_chunk() -> None:
    body = chat_body(stream=True)
    del body["stream_options"]
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            events = (await call(endpoint, "POST", "/v1/chat/completions", body)).sse()
            assert all("usage" not in data for _, data in events[:-1])


async def test_chat_non_stream_and_content_part_system_and_developer() -> None:
    body = chat_body(stream=False)
    body["messages"][0] = {"role": "system", "content": [{"type": "text", "text": "SYS-PART"}]}
    body["messages"].insert(1, {"role": "developer", "content": "DEV-MSG"})
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="ok") as endpoint:
            answer = (await call(endpoint, "POST", "/v1/chat/completions", body)).json()
            assert answer["object"] == "chat.completion"
            assert answer["choices"][0]["message"] == {"role": "assistant", "content": "ok"}
            (req,) = endpoint.main_requests()
            assert req.system_blocks() == ["SYS-PART", "DEV-MSG"]
            assert req.developer_texts() == ["DEV-MSG"]


async def test_chat_title_call_answers_the_title_and_is_not_main() -> None:
    # opencode names each session with its own call before the turn's main call; both
    # carry the user's text, so only the system prompt tells them apart.
    body = chat_body(stream=True)
    body["messages"][0] = {
        "role": "system",
        "content": "You are a title generator. You output ONLY a thread title. Nothing else.",
    }
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(delay=math.inf, title="Greeting") as endpoint:
            # delay only holds main calls: the side call must still answer at once.
            events = (await call(endpoint, "POST", "/v1/chat/completions", body)).sse()
            text = "".join(
                c["choices"][0]["delta"].get("content", "") for _, c in events[:-1] if c["choices"]
            )
            assert text == "Greeting"
            assert [r.kind for r in endpoint.requests] == ["title"]
            assert endpoint.main_requests() == []


# -- OpenAI Responses --------------------------------------------------------------------


async def test_responses_stream_sends_codex_events_then_closes_connection() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="codex reply") as endpoint:
            client = await Client.connect(endpoint.port)
            answer = await client.request(
                "POST",
                "/v1/responses",
                responses_body(stream=True),
                headers=[("authorization", "Bearer sk-fake-123"), ("originator", "codex_cli_rs")],
            )
            assert answer.headers["connection"] == "close"
            names = [name for name, _ in answer.sse()]
            deltas = names.count("response.output_text.delta")
            assert names == [
                "response.created",
                "response.output_item.added",
                *["response.output_text.delta"] * deltas,
                "response.output_item.done",
                "response.completed",
            ]
            events = dict(answer.sse())
            assert events["response.output_item.done"]["item"]["content"][0] == {
                "type": "output_text",
                "text": "codex reply",
                "annotations": [],
            }
            completed = events["response.completed"]["response"]
            assert completed["id"].startswith("resp_") and completed["usage"]["total_tokens"] > 0
            # Codex finishes a turn only when the stream ends: the server must close.
            assert await client.server_closed()
            await client.aclose()

            (req,) = endpoint.main_requests("openai-responses")
            assert req.instructions == "MARKER-OVERRIDE-456"
            assert req.developer_texts() == ["<permissions instructions>", "MARKER-DEV-123"]
            assert req.system_blocks() == [
                "MARKER-OVERRIDE-456",
                "<permissions instructions>\n\nMARKER-DEV-123",
            ]
            assert req.user_texts() == ["<environment_context/>", "hi"]
            assert req.headers["authorization"] == "Bearer sk-..."


async def test_responses_non_stream_and_string_input() -> None:
    body = {"model": "gpt-5.4", "instructions": "BASE", "input": "just a string"}
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="r") as endpoint:
            answer = (await call(endpoint, "POST", "/v1/responses", body)).json()
            assert answer["status"] == "completed" and answer["output_text"] == "r"
            (req,) = endpoint.main_requests()
            assert req.user_texts() == ["just a string"]
            assert req.developer_texts() == []
            assert req.system_text() == "BASE"


# -- Gemini generateContent --------------------------------------------------------------


def gemini_body(system: str | None = "GEMINI BASE\n\nMARKER-GEM") -> dict[str, Any]:
    body: dict[str, Any] = {
        "contents": [
            {"role": "user", "parts": [{"text": "<session_context>"}]},
            {"role": "model", "parts": [{"text": "ok"}]},
            {"role": "user", "parts": [{"text": "Say "}, {"text": "hello."}]},
        ],
        "generationConfig": {"temperature": 0},
    }
    if system is not None:
        body["systemInstruction"] = {"role": "user", "parts": [{"text": system}]}
    return body


GEMINI_STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"


async def test_gemini_stream_sends_sse_chunks_and_records_system_instruction() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="gemini says hi") as endpoint:
            answer = await call(
                endpoint,
                "POST",
                GEMINI_STREAM,
                gemini_body(),
                headers=[("x-goog-api-key", "AIza-secret-key-123")],
            )
            assert answer.headers["content-type"] == "text/event-stream"
            events = answer.sse()
            assert all(name is None for name, _ in events)
            chunks = [data for _, data in events]
            text = "".join(c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks)
            assert text == "gemini says hi"
            assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
            assert chunks[-1]["usageMetadata"]["totalTokenCount"] > 0
            assert all("finishReason" not in c["candidates"][0] for c in chunks[:-1])

            (req,) = endpoint.main_requests("gemini")
            assert req.stream and req.query == "alt=sse"
            assert req.system_text() == "GEMINI BASE\n\nMARKER-GEM"
            assert req.user_texts() == ["<session_context>", "Say hello."]
            assert req.last_user_text() == "Say hello."
            assert req.headers["x-goog-api-key"] == "AIza-secre..."


async def test_gemini_side_calls_get_json_and_are_not_main() -> None:
    body = gemini_body(system="You are a router.")
    body["generationConfig"] = {"responseMimeType": "application/json", "responseJsonSchema": {}}
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="main text") as endpoint:
            answer = await call(endpoint, "POST", "/v1beta/models/m:generateContent", body)
            text = answer.json()["candidates"][0]["content"]["parts"][0]["text"]
            assert json.loads(text)["next_speaker"] == "user"
            counted = await call(endpoint, "POST", "/v1beta/models/m:countTokens", body)
            assert counted.json()["totalTokens"] > 0
            assert endpoint.main_requests() == []
            kinds = [(r.flavour, r.kind) for r in endpoint.requests]
            assert kinds == [("gemini", "other"), ("gemini", "count_tokens")]


async def test_gemini_without_system_instruction_has_an_empty_slot() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="plain") as endpoint:
            answer = await call(
                endpoint, "POST", "/v1beta/models/m:generateContent", gemini_body(None)
            )
            assert answer.json()["candidates"][0]["finishReason"] == "STOP"
            (req,) = endpoint.main_requests()
            assert req.system_blocks() == [] and req.system_text() == ""
            assert not req.stream


# -- HTTP behaviour ----------------------------------------------------------------------


async def test_head_root_answers_200_without_body() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            answer = await call(endpoint, "HEAD", "/")
            assert answer.status == 200 and answer.body == b""
            assert endpoint.requests[0].method == "HEAD"


async def test_unknown_path_is_404_json_and_recorded() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            answer = await call(endpoint, "POST", "/v2/nothing", {"a": 1})
            assert answer.status == 404
            assert answer.json()["error"]["type"] == "not_found_error"
            (req,) = endpoint.requests
            assert (req.flavour, req.kind, req.body) == ("other", "other", {"a": 1})


async def test_malformed_json_is_400_and_recorded_with_error() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            answer = await call(endpoint, "POST", "/v1/messages", raw=b'{"model": ')
            assert answer.status == 400
            assert "not valid JSON" in answer.json()["error"]["message"]
            (req,) = endpoint.requests
            assert req.body is None and req.body_error and req.body_size == 10


async def test_json_that_is_not_an_object_is_400() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            answer = await call(endpoint, "POST", "/v1/chat/completions", [1, 2])
            assert answer.status == 400


async def test_oversized_body_is_refused_before_it_is_read() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            client = await Client.connect(endpoint.port)
            size = str(MAX_BODY_SIZE + 1)
            await client.send_head("POST", "/v1/messages", b"", [("content-length", size)])
            answer = await client.read_answer()
            assert answer.status == 413
            assert await client.server_closed()
            await client.aclose()
            assert endpoint.requests == []


async def test_gzip_body_is_decoded() -> None:
    raw = gzip.compress(json.dumps(chat_body(stream=False)).encode())
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            answer = await call(
                endpoint,
                "POST",
                "/v1/chat/completions",
                raw=raw,
                headers=[("content-encoding", "gzip")],
            )
            assert answer.status == 200
            assert endpoint.main_requests()[0].system_text().endswith("MARKER-G")


async def test_json_replies_keep_the_connection_alive() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply="one") as endpoint:
            client = await Client.connect(endpoint.port)
            first = await client.request("POST", "/v1/messages", anthropic_body(False))
            client.conn.start_next_cycle()
            second = await client.request("POST", "/v1/chat/completions", chat_body(False))
            assert first.status == second.status == 200
            await client.aclose()
            assert [r.flavour for r in endpoint.requests] == ["anthropic", "openai-chat"]


async def test_client_disconnect_mid_stream_leaves_server_serving() -> None:
    # A reply far bigger than the socket buffers keeps the server mid-stream until the
    # client hangs up.
    big = "x" * (8 * 1024 * 1024)
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply=lambda r: big if r.seq == 1 else "ok") as endpoint:
            body = json.dumps(anthropic_body(stream=True)).encode()
            await _abandon_stream(endpoint.port, body)
            assert await endpoint.wait_for_aborted(1) == [1]
            after = await call(endpoint, "POST", "/v1/responses", responses_body(stream=False))
            assert after.status == 200
            assert endpoint.errors == []


async def _abandon_stream(port: int, body: bytes) -> None:
    """Start a big streamed reply, read its first bytes, then reset the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    head = (
        b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    await stream.send_all(head + body)
    assert (await stream.receive_some(100)).startswith(b"HTTP/1.1 200")
    # SO_LINGER 0: close with a reset, as a killed agent process would.
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
    await stream.aclose()


async def test_held_stream_starts_then_waits_until_the_client_gives_up() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(delay=math.inf) as endpoint:
            client = await Client.connect(endpoint.port)
            body = json.dumps(chat_body(stream=True)).encode()
            await client.send_head("POST", "/v1/chat/completions", body, [])
            await client.stream.send_all(client.conn.send(h11.Data(data=body)))
            await client.stream.send_all(client.conn.send(h11.EndOfMessage()))
            # Headers and the first event arrive; the rest is held, as from a slow model.
            response = await client.next_event()
            assert isinstance(response, h11.Response) and response.status_code == 200
            first = await client.next_event()
            assert isinstance(first, h11.Data) and b'"role": "assistant"' in first.data
            (held,) = endpoint.main_requests()
            assert held.system_text().endswith("MARKER-G")
            await client.aclose()
            assert await endpoint.wait_for_aborted(1) == [held.seq]
            endpoint.delay = 0.0
            answer = await call(endpoint, "POST", "/v1/messages", anthropic_body(False))
            assert answer.status == 200


async def test_held_plain_reply_sends_nothing_until_released() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(delay=math.inf) as endpoint:
            client = await Client.connect(endpoint.port)
            async with trio.open_nursery() as nursery:

                async def hang() -> None:
                    with pytest.raises((trio.ClosedResourceError, trio.BrokenResourceError)):
                        await client.request("POST", "/v1/responses", responses_body(False))

                nursery.start_soon(hang)
                await endpoint.wait_for_requests(1, flavour="openai-responses")
                await client.aclose()
            assert await endpoint.wait_for_aborted(1) == [1]


async def test_wait_for_requests_times_out_naming_what_arrived() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            await call(endpoint, "HEAD", "/")
            with pytest.raises(TimeoutError, match=r"HEAD / \[other/other\]"):
                await endpoint.wait_for_requests(1, timeout=0.05)


async def test_clear_forgets_requests_but_not_sequence() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint() as endpoint:
            await call(endpoint, "POST", "/v1/messages", anthropic_body(False))
            endpoint.clear()
            assert endpoint.requests == []
            await call(endpoint, "POST", "/v1/messages", anthropic_body(False))
            assert [r.seq for r in endpoint.requests] == [2]


async def test_reply_can_depend_on_the_request() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(reply=lambda r: f"turn {r.seq}") as endpoint:
            answer = (await call(endpoint, "POST", "/v1/messages", anthropic_body(False))).json()
            assert answer["content"][0]["text"] == "turn 1"


async def test_log_path_gets_one_json_line_per_request(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with trio.fail_after(TIMEOUT):
        async with open_model_endpoint(log_path=log) as endpoint:
            await call(endpoint, "HEAD", "/")
            await call(endpoint, "POST", "/v1/responses", responses_body(stream=True))
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    first, second = read_log(lines)
    assert first.method == "HEAD"
    assert second.kind == "main" and second.instructions == "MARKER-OVERRIDE-456"
    assert second == endpoint.requests[1]


# -- sync callers ------------------------------------------------------------------------


def test_threaded_endpoint_serves_sync_clients(tmp_path: Path) -> None:
    with ThreadedModelEndpoint(reply="threaded", log_path=tmp_path / "log.jsonl") as endpoint:
        connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=TIMEOUT)
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(chat_body(stream=False)),
            headers={"content-type": "application/json"},
        )
        response = connection.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["choices"][0]["message"]["content"] == "threaded"
        connection.close()
        (req,) = endpoint.wait_for_requests(1, timeout=TIMEOUT)
        assert req.system_text().endswith("MARKER-G")
        assert endpoint.url == f"http://127.0.0.1:{endpoint.port}"
        with pytest.raises(TimeoutError):
            endpoint.wait_for_requests(2, timeout=0.05)
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 1


def test_threaded_endpoint_reports_a_busy_port() -> None:
    with ThreadedModelEndpoint() as first, pytest.raises(RuntimeError, match="failed to start"):
        ThreadedModelEndpoint(port=first.port).start()


async def test_cli_prints_url_writes_port_file_and_logs(tmp_path: Path) -> None:
    port_file, log = tmp_path / "port", tmp_path / "log.jsonl"
    command = [sys.executable, "-m", "acp_bridge.model_endpoint"]
    command += ["--port-file", str(port_file), "--log", str(log), "--reply", "from cli"]
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            process = await nursery.start(
                partial(trio.run_process, command, stdout=subprocess.PIPE, cwd=REPO, check=False)
            )
            line = b""
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1024)
                assert chunk, "the endpoint exited before printing its URL"
                line += chunk
            url = line.decode().strip()
            port = int(port_file.read_text())
            assert url == f"http://127.0.0.1:{port}"
            client = await Client.connect(port)
            answer = await client.request("POST", "/v1/messages", anthropic_body(False))
            assert answer.json()["content"][0]["text"] == "from cli"
            await client.aclose()
            process.terminate()
        assert process.returncode == 0  # SIGTERM is a clean stop
    (req,) = read_log(log.read_text().splitlines())
    assert req.system_text().endswith("MARKER-APPEND-123")


# -- the sans-IO record ------------------------------------------------------------------


def record(
    method: str, target: str, body: Any, headers: list[tuple[str, str]] | None = None
) -> RecordedRequest:
    return parse_request(
        seq=1,
        method=method,
        target=target,
        headers=headers or [],
        raw_body=json.dumps(body).encode() if body is not None else b"",
        timestamp=0.0,
        limit=MAX_BODY_SIZE,
    )


@pytest.mark.parametrize(
    ("target", "flavour"),
    [
        ("/v1/messages", "anthropic"),
        ("/anthropic/v1/messages/", "anthropic"),
        ("/v1/chat/completions", "openai-chat"),
        ("/api/v1/chat/completions?x=1", "openai-chat"),
        ("/v1/responses", "openai-responses"),
        ("/responses", "openai-responses"),
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", "gemini"),
        ("/models/x:generateContent", "gemini"),
    ],
)
def test_routing_is_by_path_suffix_under_any_prefix(target: str, flavour: str) -> None:
    rec = record("POST", target, {"model": "m"})
    assert rec.flavour == flavour and rec.kind == "main"


def test_models_probe_is_anthropic_only_with_its_version_header() -> None:
    assert record("GET", "/v1/models", None).flavour == "other"
    probe = record("GET", "/v1/models", None, [("Anthropic-Version", "2023-06-01")])
    assert probe.flavour == "anthropic" and probe.headers == {"anthropic-version": "2023-06-01"}


def test_system_extraction_ignores_non_text_parts() -> None:
    rec = record(
        "POST",
        "/v1/messages",
        {
            "system": [{"type": "text", "text": "A"}, {"type": "image"}, "junk"],
            "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
        },
    )
    assert rec.system_blocks() == ["A"]
    assert rec.user_texts() == []
    assert rec.last_user_text() == ""


def test_the_command_on_a_taken_port_says_so_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "acp_bridge.model_endpoint", "--port", str(port)],
            capture_output=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 1
    assert done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, done.stderr.decode()
    assert lines[0].startswith(f"model endpoint: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in lines[0].lower()
