"""The built-in adapters by name, found without importing any of them: standard library only.

Each built-in adapter lives in the module named after it, ``-`` spelt ``_`` (``first-turn``
in ``adapters/first_turn.py``, installed as ``acp_bridge.adapters.first_turn``; a test holds
every built-in adapter to this). So a name given on the command line can be checked, and
its adapter loaded alone, before trio, pydantic and the other adapters are imported
(:mod:`acp_bridge.launch`, :mod:`acp_bridge.early_initialize`, :func:`acp_bridge.registry.builtin`).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Final

PACKAGE: Final = "acp_bridge.adapters"


def module_of(name: str) -> str | None:
    """The module of the built-in adapter ``name``, or None if there is no such module."""
    module = name.replace("-", "_")
    if not module.isidentifier():
        return None
    spec = importlib.util.find_spec(PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if os.path.isfile(os.path.join(folder, module + ".py")):
            return f"{PACKAGE}.{module}"
    return None
