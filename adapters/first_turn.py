"""``first-turn``: for agents with no system prompt mechanism at all.

The prompt is prepended, verbatim, as a text block to the session's next
``session/prompt``: once per conversation, and again only when the session's prompt
changes. The store remembers which prompt the conversation already holds, so loading a
session after a restart does not deliver it twice. The text lands in a user turn, not the
model's system slot, so only ``append`` is offered.
"""

from __future__ import annotations

from acp_bridge.adapter import Adapter, AdapterContext, Delivery, LifecycleCall, Reply
from acp_bridge.runtime.trace import redact_at
from acp_bridge.wire.jsonrpc import JsonObject


class FirstTurnAdapter(Adapter):
    name = "first-turn"
    description = "prepend the prompt to the first session/prompt of each conversation"
    intercepts_prompt = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        # Every prompt text this adapter put in front of a user turn, so a trace can hide it.
        self._injected: set[str] = set()
        # Sessions created through this connection whose first turn is still to come: the
        # store may remember a delivery into an older conversation that had the same id.
        self._fresh: set[str] = set()

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=False)

    def redact(self, direction: str, message: JsonObject) -> JsonObject:
        """The block prepended to a ``session/prompt`` on its way to the agent."""
        if message.get("method") != "session/prompt" or not direction.startswith("bridge->"):
            return message
        params = message.get("params")
        blocks = params.get("prompt") if isinstance(params, dict) else None
        first = blocks[0] if isinstance(blocks, list) and blocks else None
        if isinstance(first, dict) and first.get("text") in self._injected:
            return redact_at(message, ("params", "prompt", 0, "text"))
        return message

    async def session_new(self, call: LifecycleCall) -> Reply:
        reply = await call.forward()
        session_id = reply.result.get("sessionId") if isinstance(reply.result, dict) else None
        if reply.ok and isinstance(session_id, str):
            self._fresh.add(session_id)
        return reply

    async def session_prompt(self, call: LifecycleCall) -> Reply:
        prompt = call.prompt
        blocks = call.params.get("prompt")
        if prompt is None or not isinstance(blocks, list):
            if prompt is None:
                self._fresh.discard(call.session_id or "")  # its first turn went without
            return await call.forward()
        fingerprint = prompt.fingerprint()
        fresh = call.session_id in self._fresh
        if call.delivered == fingerprint and not fresh:
            return await call.forward()
        self._injected.add(prompt.text)
        call.params["prompt"] = [{"type": "text", "text": prompt.text}, *blocks]
        reply = await call.forward()
        if reply.ok:
            call.mark_delivered(fingerprint)
            self._fresh.discard(call.session_id or "")
        return reply
