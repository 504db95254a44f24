"""``qwen``: one ``qwen --acp`` process per distinct system prompt.

qwen-code (``@qwen-code/qwen-code``, measured on 0.24.4) takes no prompt over ACP; its
system message is built per process, so this is a :class:`~acp_bridge.pool.PoolAdapter`.
Its system message is laid out as: base prompt, ``---``, context files (``~/.qwen/QWEN.md``,
the project's ``QWEN.md``/``AGENTS.md``), ``---``, the appended prompt, ``---``, memory.

* **override**: a process with ``QWEN_SYSTEM_MD=<private file>``; qwen uses the file's text
  as its base prompt, verbatim (no template, no trimming). Context files and memory
  still follow it. qwen reads the file only when a session starts (a file written after
  ``initialize`` reaches the model, ``tests/e2e/test_qwen.py``), so the pool keeps a
  spare process for the next override prompt, whose file it writes when it is claimed.
* **append**: a process started with ``--append-system-prompt <text>``. qwen 0.24.4 reads
  the appended prompt from its command line only (no setting, file or variable feeds it),
  so this text is visible in the process list to other local users; qwen trims it.
  The bridge never writes it to its own logs. A text holding a NUL (U+0000), which no
  argument can carry, is refused by the pool with ``-32602`` naming the block.

qwen keeps conversations on disk but not the flags a process ran with, so a
``session/load`` or ``session/resume`` (also after a bridge restart) lands in the process
of the prompt the session runs with after the ``on_omitted`` policy: the stored prompt
under ``keep``, the primary (qwen's default) under ``default``. qwen has ``session/list``
and ``session/resume``; ``session/close`` and ``session/fork`` are answered ``-32601``.
"""

from __future__ import annotations

from typing import Final

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PoolAdapter, PrivateDir, ProcessConfig, PromptRefused
from acp_bridge.wire.jsonrpc import INVALID_PARAMS

AGENT_NAME: Final = "qwen-code"
OVERRIDE_FILE: Final = "system.md"
APPEND_FLAG: Final = "--append-system-prompt"
# Linux refuses a single argv string longer than MAX_ARG_STRLEN (32 pages, NUL included).
MAX_ARG_BYTES: Final = 32 * 4096 - 1


class QwenAdapter(PoolAdapter):
    name = "qwen"
    description = (
        "qwen --acp: one process per distinct prompt (QWEN_SYSTEM_MD, --append-system-prompt)"
    )
    agent_label = "qwen"
    reported_name = AGENT_NAME
    spare_modes = frozenset({"override"})

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        return ProcessConfig(env={"QWEN_SYSTEM_MD": str(private.path / OVERRIDE_FILE)})

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        private.write(OVERRIDE_FILE, prompt.text)

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        if prompt.mode == "override":
            return super().process_config(prompt, private)
        if not prompt.text.strip():
            raise PromptRefused(
                "qwen trims an appended system prompt, and this one is only whitespace.",
                {"field": "systemPrompt.content"},
                INVALID_PARAMS,
            )
        size = len(prompt.text.encode())
        if size > MAX_ARG_BYTES:
            raise PromptRefused(
                f"The append system prompt is too long for qwen's command line "
                f"({size} bytes encoded, at most {MAX_ARG_BYTES}).",
                {"field": "systemPrompt.content"},
                INVALID_PARAMS,
            )
        # "--flag=value": a prompt starting with "-" is not read as another option.
        return ProcessConfig(args=[f"{APPEND_FLAG}={prompt.text}"])
