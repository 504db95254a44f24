"""The floor for a Python relay: trio copying bytes between the client and an agent, unread.

    python bench/raw_relay.py AGENT_CMD [ARGS...]

No framing, no parsing, no routing: what any trio-based relay costs before it looks at a
single frame. ``bench/peer_bench.py`` runs it beside the bridge as a reference.
"""

from __future__ import annotations

import os
import subprocess
import sys

import trio
from trio.lowlevel import FdStream

CHUNK = 64 * 1024  # a pipe's capacity on Linux: one read empties a full pipe


async def copy(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream) -> None:
    try:
        while data := await source.receive_some(CHUNK):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await sink.aclose()  # end of input: the other side sees EOF


async def relay(argv: list[str]) -> int:
    process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copy, FdStream(os.dup(0)), process.stdin)
        nursery.start_soon(copy, process.stdout, FdStream(os.dup(1)))
    return await process.wait()


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(trio.run(relay, sys.argv[1:]))


if __name__ == "__main__":
    main()
