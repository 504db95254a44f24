"""``kilo``: one ``kilo acp`` process per distinct system prompt, the prompt in an
instructions file named by a private configuration layer.

Kilo (npm ``@kilocode/cli``, a fork of opencode with ``OPENCODE_*`` renamed ``KILO_*``,
measured on 7.7.9) ignores ``systemPrompt`` and every ``_meta`` form and reads
instructions from its configuration once per process. So this adapter is a
:class:`~acp_bridge.pool.PoolAdapter` offering ``append`` only: each prompt's process gets
``KILO_CONFIG=<private kilo.json>``, a layer Kilo merges over the user's configuration
(``KILO_CONFIG_CONTENT`` included), whose ``instructions`` names a private file with the
text. Kilo puts it in the system message as ``Instructions from: <path>`` and the text,
after its own prompt and the user's instructions and before its skills list. No route
replaces Kilo's own prompt (an agent file is inserted after "You are Kilo…"), so
``override`` is not offered.

Kilo substitutes ``{env:NAME}`` and ``{file:PATH}`` in an instructions file (not on a line
that starts with ``//``), with no escape. The bridge writes every other ``{`` as
``{file:<private file holding "{">}`` (:func:`protect_references`): Kilo's ``{file:…}``
pass, which runs once over the text after its ``{env:…}`` pass, turns each back into
``{``, and no ``{env:…}`` is left for the first pass. So the text reaches the model as
sent, whitespace at both ends included.

Sessions live in Kilo's database under the user's data directory, shared by every
process; the system message comes from the serving process's configuration, so
``session/load`` / ``session/resume`` in the process of the prompt the session should run
with gets exactly that prompt, after a bridge restart too.

Kilo reads the instructions file only when a session starts (a file written after
``initialize`` reaches the model, ``tests/e2e/test_kilo.py``), so the pool can keep a spare
process, its configuration layer written, and write the instructions when it is claimed.
"""

from __future__ import annotations

import json
from typing import Final

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PoolAdapter, PrivateDir, ProcessConfig, PromptRefused, write_prompt_file

AGENT_NAME: Final = "Kilo"
CONFIG_VARIABLE: Final = "KILO_CONFIG"
CONFIG_FILE: Final = "kilo.json"
INSTRUCTIONS_FILE: Final = "system-prompt.md"
BRACE_FILE: Final = "brace"
# What JavaScript's String.prototype.trimStart removes, which Kilo uses to find a line
# that starts with `//` (ECMAScript WhiteSpace and LineTerminator).
JS_WHITESPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def protect_references(text: str, brace_file: str) -> str:
    """``text`` as an instructions file that Kilo's substitution turns back into ``text``.

    Each ``{`` outside a ``//`` line becomes ``{file:<brace_file>}``, a file holding ``{``.
    On a line whose start (before the brace, whitespace skipped) is ``//``, Kilo
    substitutes nothing, so the brace stays as it is.
    """
    check_reference_path(brace_file)
    reference = "{file:" + brace_file + "}"
    pieces: list[str] = []
    line_start = 0
    for index, char in enumerate(text):
        if char == "{" and not text[line_start:index].lstrip(JS_WHITESPACE).startswith("//"):
            pieces.append(reference)
        else:
            pieces.append(char)
        if char == "\n":
            line_start = index + 1
    return "".join(pieces)


def check_reference_path(brace_file: str) -> None:
    """Refuse a private path Kilo cannot name in a ``{file:…}`` reference or its config."""
    if "{" in brace_file or "}" in brace_file:
        # Kilo's reference ends at the first `}`; a `{` would be substituted in its config.
        raise PromptRefused(
            f"The bridge's private file {brace_file} has a brace in its path, which Kilo "
            f"cannot take in a file reference; set TMPDIR to a path without one.",
            {"file": brace_file},
        )


class KiloAdapter(PoolAdapter):
    name = "kilo"
    description = "kilo acp: one process per distinct prompt, a private instructions file"
    agent_label = "kilo"
    reported_name = AGENT_NAME
    spare_modes = frozenset({"append"})
    append_only = True

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        self.refuse_if_set(CONFIG_VARIABLE, "Kilo's global config file or KILO_CONFIG_CONTENT")
        # Kilo substitutes in its JSON configuration too: the private path has no brace.
        check_reference_path(str(private.path / BRACE_FILE))
        private.write(BRACE_FILE, "{")
        instructions = private.path / INSTRUCTIONS_FILE
        config = private.write(CONFIG_FILE, json.dumps({"instructions": [str(instructions)]}))
        return ProcessConfig(env={CONFIG_VARIABLE: str(config)})

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        brace = private.path / BRACE_FILE
        text = protect_references(prompt.text, str(brace))
        write_prompt_file(private, INSTRUCTIONS_FILE, text, prompt.mode, AGENT_NAME)
