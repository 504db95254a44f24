"""``python -m acp_bridge`` is the ``acp-bridge`` command."""

from acp_bridge.launch import main

main()
