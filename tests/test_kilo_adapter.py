"""The kilo adapter's part of the pool: a private configuration layer naming an
instructions file that Kilo's substitution turns back into the client's text.

:func:`kilo_substitution` restates what Kilo 7.7.9 does to an instructions file (its
``ConfigVariable.substitute`` for a trusted markdown file); that the real agent delivers the
text verbatim is asserted end to end in ``tests/e2e/test_kilo.py``.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

# The adapters folder is installed as acp_bridge.adapters through a package-dir mapping,
# which mypy cannot follow.
from acp_bridge.adapters.kilo import (  # type: ignore[import-not-found,unused-ignore]
    JS_WHITESPACE,
    KiloAdapter,
    protect_references,
)
from adapter_context import Context, ContextWithEnvironment
from hypothesis import given
from hypothesis import strategies as st

from acp_bridge.adapter import Delivery
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PrivateDir, PromptRefused
from acp_bridge.registry import AdapterRegistry
from acp_bridge.wire.jsonrpc import INVALID_PARAMS

AWKWARD = "{env:HOME} {file:/etc/hostname} ${env:HOME} {{y}} ${x}\n// {env:HOME}\n  {x}\n\n"
BRACE = "/private/brace"
INITIALIZE = {"agentInfo": {"name": "Kilo", "version": "7.7.9"}}


def kilo_substitution(text: str, env: Mapping[str, str], files: Mapping[str, str]) -> str:
    """Kilo's two passes: ``{env:NAME}``, then ``{file:PATH}`` (trimmed content) over the
    result, each match left alone on a line whose start is ``//``."""

    def commented(whole: str, index: int) -> bool:
        start = whole.rfind("\n", 0, index) + 1
        return whole[start:index].lstrip(JS_WHITESPACE).startswith("//")

    def env_value(match: re.Match[str]) -> str:
        return match[0] if commented(text, match.start()) else env.get(match[1], "")

    after_env = re.sub(r"\{env:([^}]+)\}", env_value, text)

    def file_value(match: re.Match[str]) -> str:
        if commented(after_env, match.start()):
            return match[0]
        return files.get(match[0][len("{file:") : -1], "").strip(JS_WHITESPACE)

    return re.sub(r"\{file:[^}]+\}", file_value, after_env)


def delivered(text: str) -> str:
    return kilo_substitution(
        protect_references(text, BRACE),
        {"HOME": "/home/u"},
        {BRACE: "{", "/etc/hostname": "host\n"},
    )


def test_kilo_substitutes_references_in_an_unprotected_file() -> None:
    # The restated substitution does what was measured on the real agent.
    files = {"/etc/hostname": "vm\n"}
    got = kilo_substitution(AWKWARD, {"HOME": "/h"}, files)
    assert got == "/h vm $/h {{y}} ${x}\n// {env:HOME}\n  {x}\n\n"


def test_a_protected_text_comes_back_exactly() -> None:
    assert delivered(AWKWARD) == AWKWARD
    assert delivered("{file:/x}{env:Y}{") == "{file:/x}{env:Y}{"
    assert delivered("  // {env:HOME}\n/{env:HOME}") == "  // {env:HOME}\n/{env:HOME}"


@given(st.text(alphabet=st.sampled_from(list("{}/ \t\n\u00a0\ufeffenvfil:$~x/"))))
def test_any_text_of_braces_slashes_and_references_comes_back_exactly(text: str) -> None:
    assert delivered(text) == text


@given(st.text())
def test_any_text_comes_back_exactly(text: str) -> None:
    assert delivered(text) == text


def test_a_private_path_with_a_brace_is_refused() -> None:
    with pytest.raises(PromptRefused):
        protect_references("x", "/tmp/a}b/brace")


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateDir]:
    directory = PrivateDir.create("acp-bridge-kilo-", tmp_path)
    yield directory
    directory.remove()


def test_append_is_a_private_config_layer_naming_a_protected_instructions_file(
    private: PrivateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KILO_CONFIG", raising=False)
    config = KiloAdapter(Context()).process_config(SystemPrompt.of_text("append", AWKWARD), private)
    assert config.args == ()
    (layer,) = config.env.values()
    assert config.env == {"KILO_CONFIG": layer}
    (instructions,) = json.loads(Path(layer).read_text())["instructions"]
    brace = private.path / "brace"
    assert brace.read_text() == "{"
    written = Path(instructions).read_text(encoding="utf-8")
    assert written == protect_references(AWKWARD, str(brace))
    for path in (Path(layer), Path(instructions), brace):
        assert path.parent == private.path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        (SystemPrompt.of_text("override", "MARKER"), "systemPrompt.mode"),
        (SystemPrompt.of_text("append", "lone \ud800"), "systemPrompt.content"),
    ],
)
def test_what_kilo_cannot_take_is_refused_naming_the_field(
    private: PrivateDir, prompt: SystemPrompt, field: str
) -> None:
    with pytest.raises(PromptRefused) as refused:
        KiloAdapter(ContextWithEnvironment({})).process_config(prompt, private)
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.data == {"field": field}


def test_a_users_own_config_layer_is_not_replaced(private: PrivateDir) -> None:
    adapter = KiloAdapter(ContextWithEnvironment({"KILO_CONFIG": "/mine/kilo.json"}))
    with pytest.raises(PromptRefused) as refused:
        adapter.process_config(SystemPrompt.of_text("append", "MARKER"), private)
    assert "/mine/kilo.json" in str(refused.value)
    assert refused.value.data == {"variable": "KILO_CONFIG"}


def test_kilo_is_chosen_by_its_name_and_offers_append_only() -> None:
    assert KiloAdapter(Context()).delivery(INITIALIZE) == Delivery(append=True, override=False)
    assert AdapterRegistry().choose(INITIALIZE) is KiloAdapter
