"""What a piece of work allocates at its peak, as Python's allocator saw it."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def peak_while(action: Callable[[], object]) -> int:
    """Peak bytes allocated by Python while ``action`` runs."""
    gc.collect()
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
