"""Agent processes and what they leave: spawning in a process group, the watchdog that ends
the group when the bridge dies, stopping in order, and the private folders prompt text is
written to. Knows nothing of the protocol.
"""
