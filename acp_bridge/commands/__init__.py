"""The command line: the console entry's early start (``launch``), the click commands
(``cli``: run, check, verify, sessions, serve, connect) and each command's own module.
Nothing below this package imports it.
"""
