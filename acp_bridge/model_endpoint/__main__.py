"""``python -m acp_bridge.model_endpoint``: run the model endpoint until killed.

Prints one line, the base URL, to stdout once listening (and writes the port to
``--port-file`` if given, atomically, so a poller never reads half a number). Each
request is appended to ``--log`` as one JSON line. SIGINT or SIGTERM stop it cleanly.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import signal
import sys
from pathlib import Path

import trio

from acp_bridge.model_endpoint.replies import DEFAULT_REPLY, DEFAULT_TITLE
from acp_bridge.model_endpoint.server import open_model_endpoint


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m acp_bridge.model_endpoint",
        description="Fake Anthropic/OpenAI model API on 127.0.0.1 that records every request.",
    )
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: any free port)")
    parser.add_argument("--port-file", type=Path, help="write the bound port to this file")
    parser.add_argument("--log", type=Path, help="append each request to this file as a JSON line")
    parser.add_argument("--reply", default=DEFAULT_REPLY, help="text the model answers")
    parser.add_argument("--title", default=DEFAULT_TITLE, help="session title for title calls")
    parser.add_argument(
        "--delay",
        type=float,
        default=0.0,
        help="seconds to hold each main call ('inf' = until cancelled)",
    )
    args = parser.parse_args(argv)
    if args.delay < 0 or math.isnan(args.delay):
        parser.error("--delay must be a non-negative number of seconds")
    return args


def _write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{port}\n", encoding="ascii")
    os.replace(tmp, path)


async def _serve(args: argparse.Namespace) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_model_endpoint(
            args.reply, args.delay, args.log, port=args.port, title=args.title
        ) as endpoint:
            if args.port_file is not None:
                _write_port_file(args.port_file, endpoint.port)
            print(endpoint.url, flush=True)
            async for _ in signals:
                return


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``, also from inside trio's exception groups."""
    if isinstance(exc, OSError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _os_error(inner)
        if found is not None:
            return found
    return None


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    try:
        trio.run(_serve, args)
    except Exception as exc:  # an OSError arrives wrapped by the server's nursery
        error = _os_error(exc)
        if error is None:
            raise
        if error.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            message = f"cannot listen on 127.0.0.1:{args.port}: {error.strerror}"
        else:
            message = str(error)
        print(f"model endpoint: {message}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
