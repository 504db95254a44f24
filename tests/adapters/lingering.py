"""A user adapter for the runtime tests: its ``session/new`` hook waits for the test.

``bridge.adapter_options.lingering.before``: a ``trio.Event`` the hook waits for before
``call.forward()``, so the request stays intercepted, and not forwarded, until the test
sets it.
"""

from __future__ import annotations

from acp_bridge.adapter import Adapter, Delivery, LifecycleCall, Reply
from acp_bridge.wire.jsonrpc import JsonObject


class LingeringAdapter(Adapter):
    name = "lingering"
    description = "waits for the test in its session/new hook"

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=False)

    async def session_new(self, call: LifecycleCall) -> Reply:
        before = self.context.adapter_options(self.name).get("before")
        if before is not None:
            await before.wait()
        return await call.forward()
