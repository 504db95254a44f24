"""``acme``: an example user adapter, complete and tested (``tests/test_example_adapter.py``).

A made-up agent, ``acme-agent``, reads extra instructions from
``_meta["acme.dev/instructions"]`` on ``session/new``, ``session/load``,
``session/resume`` and ``session/fork``, and adds them after its own system prompt. It has
no way to replace its prompt, so only ``append`` is offered.

Put this file in a folder named by ``bridge.adapter_paths`` in your configuration; the
bridge picks it automatically for an agent whose ``agentInfo.name`` is ``acme-agent``, or
when asked with ``--adapter acme``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from acp_bridge.adapter import Adapter, Delivery, LifecycleCall, Reply
from acp_bridge.wire.jsonrpc import JsonObject

META_KEY = "acme.dev/instructions"


class AcmeAdapter(Adapter):
    name: ClassVar[str] = "acme"
    description: ClassVar[str] = "acme-agent: the prompt in _meta['acme.dev/instructions']"

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        info = initialize_result.get("agentInfo")
        return isinstance(info, dict) and info.get("name") == "acme-agent"

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=False)

    async def _with_instructions(self, call: LifecycleCall) -> Reply:
        # call.prompt is what the session runs with once this call succeeds: the client's
        # prompt, or (policy on_omitted: keep) the one stored for the session.
        if call.prompt is not None:
            meta: dict[str, Any] = dict(call.params.get("_meta") or {})
            meta[META_KEY] = call.prompt.text
            call.params["_meta"] = meta
        return await call.forward()

    session_new = _with_instructions
    session_load = _with_instructions
    session_resume = _with_instructions
    session_fork = _with_instructions
