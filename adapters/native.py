"""``native``: the agent advertises ``systemPrompt`` itself, so the field passes through.

Chosen automatically only when no other adapter recognises the agent: advertising the
field does not prove a changed prompt applies on load/resume/fork (claude-agent-acp 0.92
and later pin a session's first prompt and get the ``claude`` adapter instead).

The bridge still validates (it must not advertise more than the agent does, and
``--no-override`` can narrow it) and still fills an omitted prompt from the store when the
``on_omitted: keep`` policy asks for it.
"""

from __future__ import annotations

from acp_bridge.adapter import Adapter, Delivery, LifecycleCall, Reply, put_prompt_back
from acp_bridge.core.capabilities import native_delivery
from acp_bridge.wire.jsonrpc import JsonObject


class NativeAdapter(Adapter):
    name = "native"
    description = "agent supports systemPrompt itself: pass it through"

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        return native_delivery(initialize_result) is not None

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        # Mirror the agent: an agent that does not advertise the field (native chosen by
        # hand) cannot apply it, so nothing is advertised and nothing intercepted.
        return native_delivery(initialize_result)

    async def _pass_prompt(self, call: LifecycleCall) -> Reply:
        put_prompt_back(call)
        return await call.forward()

    session_new = _pass_prompt
    session_load = _pass_prompt
    session_resume = _pass_prompt
    session_fork = _pass_prompt
