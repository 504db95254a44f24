"""``copilot``: one ``copilot --acp`` process per distinct system prompt, the prompt in a
private custom-instructions directory.

The GitHub Copilot CLI takes no prompt over ACP (it ignores ``systemPrompt`` and every
``_meta`` form). It reads custom instructions once per process from the directories named
in ``COPILOT_CUSTOM_INSTRUCTIONS_DIRS`` (a comma-separated list), among other places. So
this adapter is a :class:`~acp_bridge.pool.PoolAdapter`: each prompt's process gets a
private directory holding ``.github/instructions/acp-bridge.instructions.md`` with the
text, added to that list. Copilot puts the whole file into its system message verbatim,
after its own instructions (measured on 1.0.102), front matter included, so the bridge
writes none. But a file that opens with ``---`` is read as front matter first: with an
``applyTo:`` line in it, Copilot lists the file as a conditional instruction instead of
inserting it. Such a text gets one newline before it (see :func:`file_text`). ``append``
is offered; no route replaces Copilot's own prompt, so ``override`` is not.

Sessions live under the user's ``~/.copilot``, shared by every process, and the system
message is rebuilt from the serving process's instructions on every turn: a session
loaded in the process of another prompt gets that prompt. Copilot reads the file only
when a session starts (a file written after ``initialize`` reaches the model,
``tests/e2e/test_copilot.py``), so the pool keeps a spare process whose file it writes
when the next new prompt claims it.
"""

from __future__ import annotations

from typing import Final

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PoolAdapter, PrivateDir, ProcessConfig, PromptRefused, write_prompt_file

AGENT_NAME: Final = "Copilot"
DIRS_VARIABLE: Final = "COPILOT_CUSTOM_INSTRUCTIONS_DIRS"
# Copilot reads `*.instructions.md` under a listed directory's `.github/instructions/`.
INSTRUCTIONS_FILE: Final = ".github/instructions/acp-bridge.instructions.md"


def file_text(text: str) -> str:
    """The instructions file for ``text``: the text, after a newline if it opens like
    front matter (Copilot reads front matter only from a file's first line)."""
    return "\n" + text if text.lstrip("\ufeff").startswith("---") else text


def instruction_dirs(own: str | None, private: str) -> str:
    """The user's list of instruction directories with the private one added last."""
    if "," in private:
        raise PromptRefused(
            f"The bridge's private directory {private} contains a comma, which cannot be "
            f"named in {DIRS_VARIABLE}; set TMPDIR to a path without one.",
            {"variable": DIRS_VARIABLE},
        )
    dirs = [d for d in (own or "").split(",") if d.strip()]
    return ",".join([*dirs, private])


class CopilotAdapter(PoolAdapter):
    name = "copilot"
    description = "copilot --acp: one process per distinct prompt, a private instructions file"
    agent_label = "copilot"
    reported_name = AGENT_NAME
    spare_modes = frozenset({"append"})
    append_only = True

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        text = file_text(prompt.text)
        write_prompt_file(private, INSTRUCTIONS_FILE, text, prompt.mode, "copilot")

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        dirs = instruction_dirs(self.agent_variable(DIRS_VARIABLE), str(private.path))
        return ProcessConfig(env={DIRS_VARIABLE: dirs})
