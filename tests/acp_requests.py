"""The ACP request params the end-to-end tests send to a real agent through the bridge.

``systemPrompt`` values of text blocks, and the params of ``session/new``,
``session/load``, ``session/resume`` and ``session/prompt``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def text_prompt(mode: str, *texts: str) -> dict[str, Any]:
    """A ``systemPrompt`` of one text block per text."""
    return {"mode": mode, "content": [{"type": "text", "text": text} for text in texts]}


def append(text: str) -> dict[str, Any]:
    return text_prompt("append", text)


def override(text: str) -> dict[str, Any]:
    return text_prompt("override", text)


def session_params(
    cwd: str | Path, session_id: str | None = None, prompt: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``session/new`` params, or with ``session_id`` those of a load or resume."""
    params: dict[str, Any] = {"cwd": str(cwd), "mcpServers": []}
    if session_id is not None:
        params["sessionId"] = session_id
    if prompt is not None:
        params["systemPrompt"] = prompt
    return params


def prompt_params(session_id: str, text: str) -> dict[str, Any]:
    """``session/prompt`` params of one user text."""
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
