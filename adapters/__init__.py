"""Built-in adapters: one module per way an agent can receive a system prompt.

This folder is installed as ``acp_bridge.adapters``. A user's own adapters live in a folder
named by ``bridge.adapter_paths`` in the configuration and follow the same shape.
"""
