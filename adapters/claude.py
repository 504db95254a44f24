"""``claude``: every claude-agent-acp release; the prompt goes in ``_meta``.

claude-agent-acp reads ``_meta.systemPrompt`` on ``session/new``, ``session/load``,
``session/resume`` and ``session/fork``: an object ``{append}`` keeps the Claude Code
preset and appends to it, a string replaces the preset. The agent never stores the prompt,
so the bridge re-sends it on every lifecycle request. A client that sends the agent's own
``_meta.systemPrompt`` itself, without ``systemPrompt``, has it forwarded as sent.

Two version differences shape what is sent:

* A session that is still live in the agent process is reused as it is by 0.23.x (the
  new ``_meta`` is ignored), so when the prompt changes the bridge closes it first.
* Newer Claude Code CLIs record the first rendered system prompt in the transcript
  (``prompt_snapshot``) and reuse it on every later load, resume and fork. Versions whose
  SDK knows the ``snapshot`` option get ``snapshot: false`` on every request, and override
  goes through ``_meta.claudeCode.options.systemPrompt = {type: "custom", …}`` because
  the string form cannot opt out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from acp_bridge.adapter import Adapter, AgentError, AgentExited, Delivery, LifecycleCall, Reply
from acp_bridge.core.capabilities import agent_name, is_v2, session_capabilities
from acp_bridge.runtime.trace import redact_at
from acp_bridge.wire.jsonrpc import JsonObject

if TYPE_CHECKING:
    # Named only: choosing this adapter (even before the bridge has loaded) must not
    # load the validation models.
    from acp_bridge.core.system_prompt import SystemPrompt

LEGACY_NAMES: Final = frozenset(
    {"@zed-industries/claude-agent-acp", "@zed-industries/claude-code-acp"}
)
SUCCESSOR_NAME: Final = "@agentclientprotocol/claude-agent-acp"
AGENT_NAMES: Final = LEGACY_NAMES | {SUCCESSOR_NAME}

# The first @agentclientprotocol/claude-agent-acp release whose pinned Claude Agent SDK
# (0.3.257) has the `snapshot` option: 0.72.0 pins SDK 0.3.252, which has none. Older
# releases get the plain forms, which their SDK understands; see docs/adapters.md.
SNAPSHOT_SINCE: Final = (0, 73, 0)

Version = tuple[int, ...]

# Claude Code's words when it is started as root with permission checks allowed off. As root,
# claude-agent-acp allows them off whenever IS_SANDBOX is set (to anything); Claude Code
# then starts only when IS_SANDBOX is exactly 1 (0.101.0 measured with IS_SANDBOX=yes, which
# some dev containers carry). The bridge changes nothing about that, it only says why.
ROOT_REFUSAL: Final = "cannot be used with root/sudo privileges"
ROOT_HINT: Final = (
    " (acp-bridge: claude-agent-acp runs as root, and IS_SANDBOX is set to something other "
    "than 1, so it starts Claude Code allowing --dangerously-skip-permissions, which Claude "
    "Code refuses as root unless IS_SANDBOX=1. IS_SANDBOX=1 declares the machine a sandbox, "
    "a container or VM where the agent may act without asking; to keep the permission "
    "prompts instead, unset IS_SANDBOX. Set it in the environment the bridge starts in, or "
    'in a preset: agents: {claude: {env: {IS_SANDBOX: "1"}}} in the configuration file.)'
)

# Where the override text sits in a lifecycle request for versions that pin prompts.
CUSTOM_PROMPT_PATH: Final = ("params", "_meta", "claudeCode", "options", "systemPrompt", "prompt")


def parse_version(text: object) -> Version | None:
    """``"0.91.0"`` -> ``(0, 91, 0)``; pre-release and build suffixes are ignored."""
    if not isinstance(text, str):
        return None
    match = re.match(r"\s*v?(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else None


@dataclass(frozen=True)
class ClaudeAgent:
    """What the bridge needs to know about one claude-agent-acp build."""

    name: str
    version: Version | None
    can_close: bool

    @classmethod
    def from_initialize(cls, initialize_result: JsonObject | None) -> ClaudeAgent:
        result = initialize_result or {}
        info = result.get("info" if is_v2(result) else "agentInfo")
        version = parse_version(info.get("version")) if isinstance(info, dict) else None
        can_close = isinstance(session_capabilities(result).get("close"), dict)
        return cls(agent_name(result) or "", version, can_close)

    @property
    def pins_prompts(self) -> bool:
        """Whether its CLI records the first prompt of a session unless told not to."""
        if self.name != SUCCESSOR_NAME:
            return False
        # An unknown version of the successor is treated as a current one.
        return self.version is None or self.version >= SNAPSHOT_SINCE


def system_prompt_meta(prompt: SystemPrompt | None, agent: ClaudeAgent) -> JsonObject | None:
    """The ``_meta`` entries that deliver ``prompt``; ``None``: leave ``_meta`` alone.

    Sans-IO, so every version's shape is tested without an agent.
    """
    if prompt is None:
        # The agent's default prompt, but never recorded: a prompt given on a later
        # load must still be able to apply.
        return {"systemPrompt": {"snapshot": False}} if agent.pins_prompts else None
    text = prompt.text
    if prompt.mode == "append":
        append: JsonObject = {"append": text}
        if agent.pins_prompts:
            append["snapshot"] = False
        return {"systemPrompt": append}
    meta: JsonObject = {"systemPrompt": text}
    if agent.pins_prompts:
        custom = {"type": "custom", "prompt": text, "snapshot": False}
        meta["claudeCode"] = {"options": {"systemPrompt": custom}}
    return meta


def merge_meta(existing: Any, additions: JsonObject) -> JsonObject:
    """``existing`` (the client's ``_meta``) with ``additions`` merged in, key by key.

    Builds new dicts so the client's original params stay as they arrived.
    """
    merged: JsonObject = dict(existing) if isinstance(existing, dict) else {}
    for key, value in additions.items():
        current = merged.get(key)
        if isinstance(value, dict) and isinstance(current, dict) and key != "systemPrompt":
            merged[key] = merge_meta(current, value)
        else:
            merged[key] = value
    return merged


class ClaudeAdapter(Adapter):
    name = "claude"
    description = "claude-agent-acp: prompt in _meta.systemPrompt, re-sent on every lifecycle step"

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        return agent_name(initialize_result) in AGENT_NAMES

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=True)

    def redact(self, direction: str, message: JsonObject) -> JsonObject:
        """The override of versions that pin prompts (``_meta.systemPrompt`` itself is one of
        the client's forms, which the tracer always redacts)."""
        return redact_at(message, CUSTOM_PROMPT_PATH)

    def _agent(self, call: LifecycleCall) -> ClaudeAgent:
        return ClaudeAgent.from_initialize(call.link.initialize_result)

    def _apply(self, call: LifecycleCall, agent: ClaudeAgent) -> None:
        meta = call.params.get("_meta")
        if not call.client_sent_prompt and isinstance(meta, dict) and "systemPrompt" in meta:
            # The client speaks the agent's own _meta.systemPrompt and sent no systemPrompt:
            # its choice, forwarded as sent (before any stored prompt of the policy).
            return
        additions = system_prompt_meta(call.prompt, agent)
        if additions is not None:
            call.params["_meta"] = merge_meta(call.params.get("_meta"), additions)

    async def session_new(self, call: LifecycleCall) -> Reply:
        self._apply(call, self._agent(call))
        return explain_root_refusal(await call.forward())

    async def session_fork(self, call: LifecycleCall) -> Reply:
        # A fork gets a new session id, so nothing live can shadow its _meta.
        self._apply(call, self._agent(call))
        return explain_root_refusal(await call.forward())

    async def session_load(self, call: LifecycleCall) -> Reply:
        return await self._reopen(call)

    async def session_resume(self, call: LifecycleCall) -> Reply:
        return await self._reopen(call)

    async def _reopen(self, call: LifecycleCall) -> Reply:
        agent = self._agent(call)
        await self._close_if_changed(call, agent)
        self._apply(call, agent)
        return explain_root_refusal(await call.forward())

    async def _close_if_changed(self, call: LifecycleCall, agent: ClaudeAgent) -> None:
        """Close a live session whose prompt changes, so the agent rebuilds it.

        claude-agent-acp 0.23.x hands back a live session unchanged on load/resume.
        """
        session_id = call.session_id
        if session_id is None or session_id not in self.context.live_sessions():
            return
        if _fingerprint(call.prompt) == _fingerprint(call.previous):
            return
        if not agent.can_close:
            self.log.warning(
                "session %s is live and its system prompt changed, but %s does not offer "
                "session/close: the new prompt applies only after the agent restarts",
                session_id,
                agent.name or "the agent",
            )
            return
        try:
            await call.link.request("session/close", {"sessionId": session_id})
        except AgentError as exc:
            self.log.warning(
                "session/close of %s before applying its changed system prompt failed (%s): "
                "the agent may keep the previous prompt",
                session_id,
                exc,
            )
        except AgentExited:
            pass  # forwarding the request will report the exit to the client


def explain_root_refusal(reply: Reply) -> Reply:
    """``reply`` with a hint about IS_SANDBOX when Claude Code refused to start as root;
    any other reply as it came (its bytes forwarded unchanged)."""
    error = reply.error
    message = error.get("message") if error is not None else None
    if error is None or not isinstance(message, str) or ROOT_REFUSAL not in message:
        return reply
    return Reply(error={**error, "message": message + ROOT_HINT})


def _fingerprint(prompt: SystemPrompt | None) -> str | None:
    return prompt.fingerprint() if prompt is not None else None
