"""A user adapter for the ordering tests: holds ``session/new`` in its hook before forwarding.

``bridge.adapter_options.slow.delay`` seconds (default 2) pass between the hook's start
and ``call.forward()``, the way a hook that starts a process or closes a session first
would take time. For a bridge run in the test's own process, two more options hold the
answer after the agent has given it: ``hold_after``, a ``trio.Event`` the hook waits for
after forwarding, and ``ask_after``, a request of the hook's own to the agent once that
event is set (``_test/echo``, whose result becomes the answer's ``_meta.asked``).
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
        options = self.context.adapter_options(self.name)
        await trio.sleep(float(options.get("delay", 2.0)))
        reply = await call.forward()
        hold = options.get("hold_after")
        if hold is None:
            return reply
        await hold.wait()
        if not options.get("ask_after") or not isinstance(reply.result, dict):
            return reply
        asked = await self.context.primary.request("_test/echo", {"asked": "after"})
        return reply.with_result({**reply.result, "_meta": {"asked": asked}})
