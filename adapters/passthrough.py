"""``passthrough``: advertise nothing, intercept nothing; the bridge is a plain relay."""

from __future__ import annotations

from acp_bridge.adapter import Adapter, Delivery
from acp_bridge.wire.jsonrpc import JsonObject


class PassthroughAdapter(Adapter):
    name = "passthrough"
    description = "relay only: no systemPrompt capability"

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return None
