"""The trio runtime: the I/O around the core.

``relay`` runs one client connection (pumps, outboxes, one task per interception, store
calls off the loop, shutdown); ``agents`` starts, replays to and stops its agent processes
and lends adapters what they may use; ``early_initialize`` and ``handover`` answer ``initialize``
before it has loaded and replay that exchange through it; ``embedded`` and ``client`` run a
bridge and an ACP client in one process (``check``, ``verify``, tests); ``stdio``,
``hangup``, ``refusal`` and ``trace`` are the edges of a connection. Decisions come from
:mod:`acp_bridge.core`; this layer carries them out.
"""
