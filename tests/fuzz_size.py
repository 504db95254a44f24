"""How many inputs the property tests and the seeded fuzzers draw.

By default each draws a quarter of its full number (at least 50): enough for what each
asserts about the inputs it made (the relay fuzz's counts of deep values and huge
numbers) and to find the defects each was written for, at a fraction of the CPU. With
``ACP_BRIDGE_FULL_FUZZ=1`` in the environment each draws its full number, for a longer
search before a release or after a change to the wire layer.
"""

from __future__ import annotations

import os
from typing import Final

FULL: Final = os.environ.get("ACP_BRIDGE_FULL_FUZZ", "") not in ("", "0")
SHARE: Final = 4
LEAST: Final = 50


def inputs(full: int) -> int:
    """``full``, or a quarter of it (at least 50) unless the full run is asked for."""
    return full if FULL else max(full // SHARE, min(full, LEAST))
