"""The wire: bytes to lines and lines to JSON-RPC envelopes, sans-IO.

``framing`` splits a stream into bounded lines, ``json_stream`` judges a line too long to
hold as it passes, ``jsonrpc`` classifies a line (keeping its bytes) and is the one place
that builds the frames and error objects the bridge writes. Nothing here decides where a
frame goes.
"""
