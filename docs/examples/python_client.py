"""A Python ACP client that gives an agent a system prompt through acp-bridge.

It uses the ACP Python SDK (``pip install agent-client-protocol``; written against
0.12.1), whose schema predates the ``systemPrompt`` field. So:

* the prompt goes as a keyword argument, ``system_prompt={...}``: the SDK puts unknown
  keywords into ``_meta`` under the name given, and the bridge takes
  ``_meta.system_prompt`` like the standard field (validated the same way; an error names
  ``_meta.system_prompt…``);
* the capability the bridge advertises is not in the SDK's typed ``InitializeResponse``
  (its models drop fields they do not know), so an observer on the connection reads it
  from the raw answer.

Run it with the bridge's command line after ``--``::

    python python_client.py -- acp-bridge --agent claude
    python python_client.py --prompt "Answer in French." -- acp-bridge -- my-agent --acp

It prints what the bridge offers, then the agent's answer to one question.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any, cast

from acp import PROTOCOL_VERSION, Client, spawn_agent_process, text_block
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AgentMessageChunk,
    DeniedOutcome,
    RequestPermissionResponse,
    TextContentBlock,
)


class PrintingClient:
    """The client side: keeps the agent's answer as it streams; refuses permissions.
    The SDK answers the agent's other requests (files, terminals) "method not found"."""

    def __init__(self) -> None:
        self.answer: list[str] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            self.answer.append(update.content.text)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: Any, **kwargs: Any
    ) -> RequestPermissionResponse:
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))


class InitializeAnswer:
    """Keeps the raw ``initialize`` answer as it came off the wire."""

    def __init__(self) -> None:
        self.result: dict[str, Any] = {}

    def __call__(self, event: StreamEvent) -> None:
        message = event.message
        if event.direction is StreamDirection.INCOMING and not self.result:
            result = message.get("result")
            if isinstance(result, dict) and "agentCapabilities" in result:
                self.result = result

    def system_prompt_capability(self) -> dict[str, Any] | None:
        """``agentCapabilities.sessionCapabilities.systemPrompt`` (ACP v1), if offered."""
        capabilities = self.result.get("agentCapabilities") or {}
        session = capabilities.get("sessionCapabilities") or {}
        offered = session.get("systemPrompt")
        return offered if isinstance(offered, dict) else None


async def main(prompt: str, question: str, command: list[str]) -> None:
    client = PrintingClient()
    answer = InitializeAnswer()
    async with (
        spawn_agent_process(
            cast(Client, client),  # the two Client methods this example needs
            command[0],
            *command[1:],
            # The SDK gives the process a trimmed environment by default (HOME, PATH, …): pass
            # ours, or the agent misses its API key and answers "Authentication required".
            env=dict(os.environ),
            transport_kwargs={"stderr": None},  # the bridge's and the agent's log: ours
            observers=[answer],
        ) as (connection, _process)
    ):
        await connection.initialize(protocol_version=PROTOCOL_VERSION)
        offered = answer.system_prompt_capability()
        if offered is None:
            raise SystemExit("the agent offers no systemPrompt (is acp-bridge in front of it?)")
        override = isinstance(offered.get("mode"), dict) and "override" in offered["mode"]
        print(f"systemPrompt offered: append{' and override' if override else ' only'}")

        session = await connection.new_session(
            cwd=os.getcwd(),
            mcp_servers=[],
            system_prompt={"mode": "append", "content": [{"type": "text", "text": prompt}]},
        )
        await connection.prompt(session_id=session.session_id, prompt=[text_block(question)])
        print("".join(client.answer))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--prompt", default="Answer in one short sentence.")
    parser.add_argument("--question", default="What is the Agent Client Protocol?")
    parser.add_argument("command", nargs="+", help="the bridge's command line, after --")
    args = parser.parse_args()
    asyncio.run(main(args.prompt, args.question, args.command))
