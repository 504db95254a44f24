"""The sans-IO protocol core: routing, pending requests, per-session order and the session table.

Nothing in this package touches a stream, a process, a clock or the session database.
:class:`~acp_bridge.core.router.Router` takes parsed frames and where they came from, queues
the bytes each peer must get until the runtime takes them (``data_to_send``), and returns
the few events the runtime must act on (start an interception, wake a waiter); its
:class:`~acp_bridge.core.hops.Hops` are the agent processes and which session lives in which.
:class:`~acp_bridge.core.sessions.SessionTable` holds the lifecycle rules: what an
intercepted request runs with, and what must be stored or sent to the agent once it is
answered, returned as values. ``system_prompt`` validates the field and ``capabilities``
builds what the bridge advertises. The trio runtime (:mod:`acp_bridge.runtime.relay`) does the I/O
around both.
"""
