"""The trio runtime: the I/O around the core.

``relay`` runs one client connection: its ``Bridge`` wires ``agents`` (starting, replaying
to and stopping its agent processes), ``connection`` (the outboxes, the router's output
carried out), ``pumps`` (reading each peer), ``interception`` (one task per intercepted
request, store calls off the loop) and ``shutdown``; ``adapter_context`` is what an
adapter is lent; ``early_initialize`` and ``handover`` answer ``initialize`` before the
runtime has loaded and replay that exchange through it; ``embedded`` and ``client`` run a
bridge and an ACP client in one process (``check``, ``verify``, tests); ``stdio``,
``hangup``, ``refusal`` and ``trace`` are the edges of a connection. Decisions come from
:mod:`acp_bridge.core`; this layer carries them out.
"""
