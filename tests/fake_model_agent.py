"""A fake ACP agent that calls a model, for ``acp-bridge verify`` tests (stdlib only).

It advertises ``systemPrompt`` itself (append and override), ``loadSession``, resume,
fork and close, and keeps its sessions in a JSON file (``--sessions``) so that they
outlive the agent process, as verify's bridge restarts need. Every ``session/prompt``
becomes one OpenAI Chat Completions call to ``$OPENAI_BASE_URL/v1/chat/completions``
whose ``system`` message is the agent's default prompt with the session's append prompt
after it, or the override prompt alone.

- ``--pin``: a reopened session keeps the prompt it was created with, whatever
  load/resume sends (what claude-agent-acp 0.92+ does natively).
- ``--noise N``: write N lines of debug chatter to stderr for every request, like a real
  agent's logging.
"""

from __future__ import annotations

import json
import os
import socket
import sys

# verify starts this agent three times a run: it imports no argparse, urllib.request,
# pathlib, uuid or typing (a start took 28 ms of CPU under ``python -S``, 84 ms with them
# and the site module), and speaks the one HTTP request it makes itself.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_PROMPT = (
    "You are the fake model agent used by the acp-bridge tests.\n"
    "Answer every question with one short and friendly sentence.\n"
    "Never run a tool unless the user asks for one explicitly."
)
CAPABILITIES = {
    "loadSession": True,
    "sessionCapabilities": {
        "systemPrompt": {"mode": {"override": {}}},
        "resume": {},
        "fork": {},
        "close": {},
    },
}


class Agent:
    def __init__(self, sessions: str, pin: bool, noise: int) -> None:
        self.path = sessions
        self.pin = pin
        self.noise = noise
        self.sessions: dict[str, Any] = {}
        if os.path.exists(sessions):
            with open(sessions) as file:
                self.sessions = json.load(file)

    def save(self) -> None:
        with open(self.path, "w") as file:
            file.write(json.dumps(self.sessions))

    def chatter(self, method: str) -> None:
        for index in range(self.noise):
            print(f"fake-model-agent DEBUG {method} detail line {index}", file=sys.stderr)
        sys.stderr.flush()

    def handle(self, method: str, params: dict[str, Any]) -> Any:
        if method == "initialize":
            return {
                "protocolVersion": 1,
                "agentCapabilities": CAPABILITIES,
                "agentInfo": {"name": "fake-model-agent", "version": "1.0.0"},
                "authMethods": [],
            }
        if method in ("session/new", "session/fork"):
            session_id = f"fake-{os.urandom(6).hex()}"
            self.sessions[session_id] = params.get("systemPrompt")
            self.save()
            return {"sessionId": session_id}
        if method in ("session/load", "session/resume"):
            session_id = params["sessionId"]
            if session_id not in self.sessions:
                raise KeyError(session_id)
            if not self.pin:
                self.sessions[session_id] = params.get("systemPrompt")
                self.save()
            return None if method == "session/load" else {}
        if method == "session/close":
            return {}
        if method == "session/prompt":
            self.call_model(params)
            return {"stopReason": "end_turn"}
        raise NotImplementedError(method)

    def call_model(self, params: dict[str, Any]) -> None:
        prompt = self.sessions[params["sessionId"]]
        text = "\n\n".join(block["text"] for block in prompt["content"]) if prompt else ""
        system = text if prompt and prompt["mode"] == "override" else DEFAULT_PROMPT
        if prompt and prompt["mode"] == "append":
            system += "\n\n" + text
        user = " ".join(block.get("text", "") for block in params["prompt"])
        body = {
            "model": "fake-model",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
        }
        post(os.environ["OPENAI_BASE_URL"] + "/v1/chat/completions", json.dumps(body).encode())


def post(url: str, data: bytes) -> None:
    """POST ``data`` as JSON to an ``http://host:port/path`` URL and read the whole answer;
    raise OSError unless it is a 200."""
    address, _, path = url.removeprefix("http://").partition("/")
    host, _, port = address.rpartition(":")
    head = (
        f"POST /{path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-fake\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection((host.strip("[]"), int(port)), timeout=30) as connection:
        connection.sendall(head.encode() + data)
        answer = b""
        while chunk := connection.recv(1 << 16):
            answer += chunk
    status = answer.split(b"\r\n", 1)[0].split()
    if status[1:2] != [b"200"]:
        raise OSError(f"the model endpoint answered {status!r}")


def main() -> None:
    argv = sys.argv[1:]
    sessions = argv[argv.index("--sessions") + 1]
    noise = int(argv[argv.index("--noise") + 1]) if "--noise" in argv else 0
    agent = Agent(sessions, "--pin" in argv, noise)
    for line in sys.stdin:
        message = json.loads(line)
        if "method" not in message or "id" not in message:
            continue
        agent.chatter(message["method"])
        try:
            reply = {"result": agent.handle(message["method"], message.get("params") or {})}
        except Exception as exc:  # any failure becomes a JSON-RPC error for the client
            reply = {"error": {"code": -32603, "message": f"{type(exc).__name__}: {exc}"}}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], **reply}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
