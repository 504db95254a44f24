"""A user adapter for the ordering tests: holds ``session/new`` in its hook before forwarding.

``bridge.adapter_options.slow.delay`` seconds (default 2) pass between the hook's start
and ``call.forward()``, the way a hook that starts a process or closes a session first
would take time.
"""

from __future__ import annotations

import trio

from acp_bridge.adapter import Adapter, Delivery, LifecycleCall, Reply
from acp_bridge.wire.jsonrpc import JsonObject


class SlowAdapter(Adapter):
    name = "slow"
    description = "holds session/new in its hook before forwarding it"

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=False)

    async def session_new(self, call: LifecycleCall) -> Reply:
        await trio.sleep(float(self.context.adapter_options(self.name).get("delay", 2.0)))
        return await call.forward()
