"""A user adapter for the runtime tests: its step after ``call.forward()`` fails.

Each opening hook forwards the request and then raises, the way an adapter's own delivery
step (a request of its own to the agent, a file to write) fails after the agent has
already opened the session for the client.
"""

from __future__ import annotations

from acp_bridge.adapter import Adapter, Delivery, LifecycleCall, Reply
from acp_bridge.wire.jsonrpc import JsonObject


class BrokenStepAdapter(Adapter):
    name = "broken-step"
    description = "forwards each opening request, then fails its own delivery step"

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=False)

    async def _fail_after_forward(self, call: LifecycleCall) -> Reply:
        await call.forward()
        raise RuntimeError("the adapter's delivery step failed")

    session_new = _fail_after_forward
    session_load = _fail_after_forward
    session_resume = _fail_after_forward
    session_fork = _fail_after_forward
