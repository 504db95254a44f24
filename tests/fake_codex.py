"""A fake codex-acp for the codex adapter's tests (stdlib only), run as several processes.

Like the real one it takes ``-c key=value`` overrides, names itself ``codex-acp``, hands
out session ids that are unique across processes, and ignores stdin EOF. Every process
appends what it received to ``<record-dir>/<pid>.jsonl``; its first line holds its
overrides. ``session/prompt`` answers with an ``agent_message_chunk`` naming the process's
``developer_instructions`` (from ``-c``, else from ``$CODEX_HOME/config.toml``) and the
contents of its ``model_instructions_file``.

Test steering: a prompt whose text is ``hang`` is answered only by ``session/cancel``
(stopReason ``cancelled``); ``ask`` first sends the client a ``fs/read_text_file``
request with the fixed id 0 (so two processes asking at once collide on purpose) and a
``$/cancel_request`` for it, then waits for the client's answer; ``exit`` makes the
process exit at once with status 3, answering nothing.

Like codex-acp 0.16, a session's rollout writer is released a moment after
``session/close`` is answered: a ``session/load``/``session/resume`` of it within
``CLOSE_SETTLE`` seconds fails with ``-32603 Internal error``.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Pools start this agent by the dozen: it imports no pathlib, uuid or typing (a start and
# an answer took 22 ms of CPU under ``python -S``, 35 ms with them and the site module).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

out = sys.stdout.buffer
CLOSE_SETTLE = 0.3


def send(message: Any) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def parse_args(argv: list[str]) -> tuple[dict[str, str], str]:
    overrides: dict[str, str] = {}
    record_dir = "."
    index = 0
    while index < len(argv):
        if argv[index] == "-c":
            key, _, value = argv[index + 1].partition("=")
            overrides[key] = value
            index += 2
        elif argv[index] == "--record-dir":
            record_dir = argv[index + 1]
            index += 2
        else:
            index += 1
    return overrides, record_dir


def new_session_id() -> str:
    """A random id in uuid4's form, as codex-acp hands out."""
    digits = bytearray(os.urandom(16))
    digits[6] = digits[6] & 0x0F | 0x40  # version 4
    digits[8] = digits[8] & 0x3F | 0x80  # the RFC 4122 variant
    h = digits.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def toml_string(value: str) -> str:
    # What the adapter sends is a TOML basic string, which JSON can read here.
    return str(json.loads(value)) if value.startswith('"') else value


def main() -> None:  # noqa: PLR0915 - one flat dispatch, like the real agent's
    overrides, record_dir = parse_args(sys.argv[1:])
    record = open(os.path.join(record_dir, f"{os.getpid()}.jsonl"), "a", encoding="utf-8")  # noqa: SIM115
    record.write(json.dumps({"overrides": overrides}) + "\n")
    record.flush()
    developer = toml_string(overrides.get("developer_instructions", "")) or None
    config = os.path.join(os.environ.get("CODEX_HOME", "/nonexistent"), "config.toml")
    if developer is None and os.path.isfile(config):
        # Like codex, a root key of CODEX_HOME/config.toml when no -c names it.
        with open(config) as config_file:
            config_lines = config_file.read().splitlines()
        for line in config_lines:
            key, _, value = line.partition(" = ")
            if key == "developer_instructions":
                developer = toml_string(value)
    base = None
    if "model_instructions_file" in overrides:
        with open(toml_string(overrides["model_instructions_file"])) as base_file:
            base = base_file.read().strip()
    identity = {"developer": developer, "base": base, "pid": os.getpid()}
    hanging: dict[Any, Any] = {}  # sessionId -> prompt request id
    closed_at: dict[Any, float] = {}  # sessionId -> when session/close was answered
    asked: dict[Any, Any] = {}  # our request id to the client -> prompt request id

    for raw in sys.stdin.buffer:
        record.write(raw.decode().rstrip("\n") + "\n")
        record.flush()
        message = json.loads(raw)
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method is None:
            waiting = asked.pop(request_id, None)
            if waiting is not None:
                send({"jsonrpc": "2.0", "id": waiting, "result": {"stopReason": "end_turn"}})
            continue
        if method == "session/cancel":
            waiting = hanging.pop(params.get("sessionId"), None)
            if waiting is not None:
                send({"jsonrpc": "2.0", "id": waiting, "result": {"stopReason": "cancelled"}})
            continue
        if request_id is None:
            continue

        def answer(result: Any, _id: Any = request_id) -> None:
            send({"jsonrpc": "2.0", "id": _id, "result": result})

        if method == "initialize":
            answer(
                {
                    "protocolVersion": 1,
                    "agentCapabilities": {
                        "loadSession": True,
                        "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
                    },
                    "authMethods": [],
                    "agentInfo": {"name": "codex-acp", "title": "Codex", "version": "0.16.0"},
                }
            )
        elif method == "session/new":
            answer({"sessionId": new_session_id()})
        elif method == "session/list":
            answer({"sessions": [], "answeredBy": os.getpid()})
        elif method in ("session/load", "session/resume") and (
            time.monotonic() - closed_at.get(params.get("sessionId"), -CLOSE_SETTLE) < CLOSE_SETTLE
        ):
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": -32603, "message": "Internal error"},
                }
            )
        elif method == "session/close":
            closed_at[params.get("sessionId")] = time.monotonic()
            answer({})
        elif method in ("session/load", "session/resume", "authenticate"):
            answer({})
        elif method == "session/prompt":
            session_id = params.get("sessionId")
            text = "".join(b.get("text", "") for b in params.get("prompt", []))
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": session_id,
                        "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": json.dumps(identity)},
                        },
                    },
                }
            )
            if text == "hang":
                hanging[session_id] = request_id
            elif text == "exit":
                os._exit(3)
            elif text == "ask":
                asked[0] = request_id
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": 0,
                        "method": "fs/read_text_file",
                        "params": {"sessionId": session_id, "path": "/nonexistent"},
                    }
                )
                # Then give up on it, as an agent does when its turn is cancelled.
                send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 0}})
            else:
                answer({"stopReason": "end_turn"})
        else:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": -32601, "message": "Method not found"},
                }
            )
    # codex-acp keeps running after stdin EOF; so does this fake.
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
