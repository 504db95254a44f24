"""What survives a restart: the SQLite session table (``store``) and its binding to one
agent identity (``lifecycle``), called by the runtime from a worker thread.
"""
