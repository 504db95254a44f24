"""acp-bridge: give any ACP agent the client-provided ``systemPrompt`` session capability."""

__version__ = "0.2.0"
