"""Finding adapters: the built-in ones (top-level ``adapters/`` folder, installed as
``acp_bridge.adapters``) and a user's own, from folders named in the configuration.

An adapter module defines one or more :class:`~acp_bridge.adapter.Adapter` subclasses with
a non-empty ``name``.

Automatic choice (spec section 7: the adapter that passes ``verify`` for the agent at hand):

1. the first adapter, by name, whose ``detect`` accepts the agent's ``initialize`` response:
   an adapter that recognises an agent knows its quirks, and a native advertisement alone
   does not prove the agent applies a changed prompt (``@agentclientprotocol/claude-agent-acp``
   0.92 and later advertise ``systemPrompt`` but pin a session's first one, so ``claude``
   wins over ``native`` for them);
2. ``native`` when the agent advertises ``systemPrompt`` itself;
3. ``first-turn``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from acp_bridge import builtin_adapters
from acp_bridge.adapter import Adapter
from acp_bridge.capabilities import native_delivery
from acp_bridge.jsonrpc import JsonObject

AUTO = "auto"
FALLBACK = "first-turn"
NATIVE = "native"


class AdapterNotFound(Exception):
    pass


def _adapters_in(module: ModuleType) -> list[type[Adapter]]:
    return [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, Adapter) and obj.__module__ == module.__name__ and obj.name
    ]


def _builtin_modules() -> Iterable[ModuleType]:
    package = importlib.import_module(builtin_adapters.PACKAGE)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        yield importlib.import_module(f"{builtin_adapters.PACKAGE}.{info.name}")


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
        self.adapters: dict[str, type[Adapter]] = {}
        for module in _builtin_modules():
            self._add(module)
        # User adapters come last so they can replace a built-in of the same name.
        for folder in extra_folders:
            for module in _user_modules(Path(folder)):
                self._add(module)

    def _add(self, module: ModuleType) -> None:
        for adapter in _adapters_in(module):
            self.adapters[adapter.name] = adapter

    def names(self) -> list[str]:
        return sorted(self.adapters)

    def get(self, name: str) -> type[Adapter]:
        try:
            return self.adapters[name]
        except KeyError:
            known = ", ".join(self.names())
            raise AdapterNotFound(f"unknown adapter {name!r}; known adapters: {known}") from None

    def choose(self, initialize_result: JsonObject) -> type[Adapter]:
        for name in self.names():
            adapter = self.adapters[name]
            if name not in (NATIVE, FALLBACK) and adapter.detect(initialize_result):
                return adapter
        if native_delivery(initialize_result) is not None:
            return self.get(NATIVE)
        return self.get(FALLBACK)
