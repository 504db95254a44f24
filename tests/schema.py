"""Validate frames against the official ACP JSON schemas (``tests/acp-schema/``).

The schemas are the unstable ones (they define ``SystemPrompt``), for protocol versions 1
and 2. A frame is checked against the top-level message union of its side of the
connection, and a result or error body against its own ``$defs`` entry.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Final

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import best_match  # type: ignore[import-untyped]
from referencing import Registry, Resource

SCHEMA_DIR: Final = Path(__file__).with_name("acp-schema")
DRAFT: Final = "https://json-schema.org/draft/2020-12/schema"


def _uri(version: int) -> str:
    return f"urn:acp-schema:v{version}"


@cache
def schema(version: int) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        (SCHEMA_DIR / f"v{version}" / "schema.unstable.json").read_text()
    )
    # The validator class below must match the draft the files are written in.
    assert document["$schema"] == DRAFT, document["$schema"]
    Draft202012Validator.check_schema(document)  # slow (seconds): once per version
    return document


@cache
def _registry(version: int) -> Registry[Any]:
    resource: Resource[Any] = Resource.from_contents(schema(version))
    registry: Registry[Any] = Registry().with_resource(_uri(version), resource)
    return registry


@cache
def _validator(version: int, definition: str | None) -> Any:
    document = schema(version)
    target: dict[str, Any] = {"$ref": _uri(version)}
    if definition is not None:
        assert definition in document["$defs"], f"v{version} has no $defs/{definition}"
        target = {"$ref": f"{_uri(version)}#/$defs/{definition}"}
    return Draft202012Validator(target, registry=_registry(version))


# What validating each distinct value found (None: valid), by version, definition and the
# value's text: validation depends on nothing else, and the tests validate the same frames
# many times (1,606 checks of 700 values in a run of the suite).
_FOUND: dict[tuple[int, str | None, str], str | None] = {}


def _check(value: Any, version: int, definition: str | None) -> None:
    key = (version, definition, json.dumps(value, sort_keys=True))
    if key not in _FOUND:
        error = best_match(_validator(version, definition).iter_errors(value))
        _FOUND[key] = None if error is None else f"{error.message} at {list(error.absolute_path)}"
    found = _FOUND[key]
    if found is not None:
        raise AssertionError(f"not a valid v{version} {definition or 'the message union'}: {found}")


def validate_definition(value: Any, definition: str, *, version: int) -> None:
    """Assert ``value`` is a valid ``$defs/<definition>`` of the given protocol version."""
    _check(value, version, definition)


def validate_agent_frame(frame: Any, *, version: int) -> None:
    """Assert a frame the client receives is a valid agent-side message.

    The whole message is checked against the schema's top-level union, and a response's
    ``error`` against ``$defs/Error`` on its own, so a bad error cannot hide behind another
    branch of the union.
    """
    _check(frame, version, None)
    if "method" not in frame:
        kind = "AgentResponse"
    else:
        kind = "AgentRequest" if "id" in frame else "AgentNotification"
    _check(frame, version, kind)
    if "error" in frame:
        _check(frame["error"], version, "Error")


def validate_initialize_response(frame: Any, *, version: int) -> None:
    """Assert an ``initialize`` response frame is valid, its result an InitializeResponse."""
    validate_agent_frame(frame, version=version)
    assert "result" in frame, frame
    _check(frame["result"], version, "InitializeResponse")
