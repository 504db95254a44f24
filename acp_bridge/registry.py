"""Finding adapters: the built-in ones (top-level ``adapters/`` folder, installed as
``acp_bridge.adapters``), each imported only when it is asked for, and a user's own, from
folders named in the configuration, imported at once.

An adapter module defines one or more :class:`~acp_bridge.adapter.Adapter` subclasses with
a non-empty ``name``; a user's adapter replaces a built-in one of the same name.

Automatic choice: a user's adapter whose ``detect`` accepts the agent's ``initialize``
answer (the first by name), else the built-in one the table of agent names picks
(:func:`acp_bridge.builtin_adapters.choose`: an adapter for the agent's name, else
``native`` when the agent advertises ``systemPrompt`` itself, else ``first-turn``). Only
the chosen built-in adapter is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING

from acp_bridge import builtin_adapters
from acp_bridge.adapter import Adapter
from acp_bridge.builtin_adapters import AUTO, FALLBACK, NATIVE
from acp_bridge.core.capabilities import agent_name, native_delivery
from acp_bridge.wire.jsonrpc import JsonObject

if TYPE_CHECKING:
    # pathlib is needed only for a user's adapter folders: the early initialize answer,
    # which imports this module, does without it.
    from pathlib import Path

__all__ = ["AUTO", "FALLBACK", "NATIVE", "AdapterNotFound", "AdapterRegistry", "builtin"]


class AdapterNotFound(Exception):
    pass


def _adapters_in(module: ModuleType) -> list[type[Adapter]]:
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, Adapter)
        and obj.__module__ == module.__name__
        and obj.name
    ]


def _user_modules(folder: Path) -> Iterable[ModuleType]:
    if not folder.is_dir():
        raise AdapterNotFound(f"adapter folder {folder} does not exist")
    for path in sorted(folder.glob("*.py")):
        name = f"acp_bridge_user_adapters.{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        yield module


def builtin(name: str) -> type[Adapter]:
    """The built-in adapter ``name``, importing only its own module.

    A built-in adapter lives in the module named after it (``first-turn`` in
    ``first_turn.py``), so the bridge can check a name given on the command line, and use
    it, without loading every adapter (:func:`acp_bridge.builtin_adapters.module_of`).
    """
    module_name = builtin_adapters.module_of(name)
    if module_name is not None:
        for adapter in _adapters_in(importlib.import_module(module_name)):
            if adapter.name == name:
                return adapter
    raise AdapterNotFound(f"no built-in adapter {name!r}")


class AdapterRegistry:
    def __init__(self, extra_folders: Iterable[Path] = ()) -> None:
        # A user's adapters, by name; built-in ones are imported by get().
        self.user_adapters: dict[str, type[Adapter]] = {}
        from pathlib import Path  # here only: see the imports at the top

        for folder in extra_folders:
            for module in _user_modules(Path(folder)):
                for adapter in _adapters_in(module):
                    self.user_adapters[adapter.name] = adapter

    def names(self) -> list[str]:
        return sorted({*builtin_adapters.names(), *self.user_adapters})

    def get(self, name: str) -> type[Adapter]:
        if name in self.user_adapters:
            return self.user_adapters[name]
        try:
            return builtin(name)
        except AdapterNotFound:
            known = ", ".join(self.names())
            raise AdapterNotFound(f"unknown adapter {name!r}; known adapters: {known}") from None

    def choose(self, initialize_result: JsonObject) -> type[Adapter]:
        for name in sorted(self.user_adapters):
            adapter = self.user_adapters[name]
            if name not in (NATIVE, FALLBACK) and adapter.detect(initialize_result):
                return adapter
        advertises = native_delivery(initialize_result) is not None
        return self.get(builtin_adapters.choose(agent_name(initialize_result), advertises))
