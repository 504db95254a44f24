"""Stand-ins for the relay's ``AdapterContext`` when a pool adapter's ``process_config``
is tested on its own, without a relay or agent processes."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any


class Primary:
    """The primary agent process before its ``initialize`` answer is known: adapters that
    tell agent versions apart by it (codex) take their first route."""

    initialize_result: dict[str, Any] | None = None


class Context:
    """A relay with no adapter options that cannot say the agent's environment (the
    adapter then reads the bridge's own)."""

    log = logging.getLogger("test-adapter")
    primary = Primary()

    def adapter_options(self, adapter: str) -> Mapping[str, Any]:
        return {}


class ContextWithEnvironment(Context):
    """A relay that tells the environment its agent processes start with."""

    def __init__(self, environment: Mapping[str, str]) -> None:
        self.environment = environment

    def agent_environment(self) -> Mapping[str, str]:
        return self.environment
