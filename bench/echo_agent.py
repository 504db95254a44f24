"""A minimal, fast ACP-shaped agent for the relay benchmark (stdlib only).

It does only what the benchmark needs and avoids JSON parsing where it can, so that the
agent itself does not hide the bridge's cost:

- a request ``{"jsonrpc":"2.0","id":N,"method":"bench/echo",...}`` is answered with the
  same params (``{"jsonrpc":"2.0","id":N,"result":<params>}``);
- ``bench/flood`` with ``{"count":C}`` writes C small notifications, then answers;
- ``bench/blank`` with ``{"bytes":B}`` writes B newlines (blank lines), then answers;
- notifications are counted, and a batch as one; ``bench/count`` answers with how many
  arrived;
- ``initialize`` gets a minimal v1 answer, so that proxies which wait for it (the bridge
  chooses its adapter from it, the TypeScript conductor starts the agent on it) relay it;
  ``--initialize-after SECONDS`` answers it that late, reading nothing meanwhile, as an
  agent that takes its time to start.
"""

from __future__ import annotations

import json
import sys
import time

INITIALIZE_RESULT = b'{"protocolVersion":1,"agentCapabilities":{},"authMethods":[]}'
NOTE = (
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"tok"}}}}\n'
)


def main() -> None:
    initialize_after = 0.0
    if sys.argv[1:2] == ["--initialize-after"]:
        initialize_after = float(sys.argv[2])
    read = sys.stdin.buffer.readline
    out = sys.stdout.buffer
    notes = 0
    while line := read():
        if line.startswith((b'{"jsonrpc":"2.0","method"', b"[")):
            notes += 1
            continue
        # Requests are written by the benchmark as {"jsonrpc":"2.0","id":N,"method":"M","params":P}
        id_end = line.index(b",", 22)
        request_id = line[22:id_end]
        method_end = line.index(b'"', id_end + 11)
        method = line[id_end + 11 : method_end]
        if method == b"bench/echo":
            params = line[method_end + 11 : line.rindex(b"}")]
            out.write(b'{"jsonrpc":"2.0","id":' + request_id + b',"result":' + params + b"}\n")
        elif method == b"initialize":
            time.sleep(initialize_after)
            result = INITIALIZE_RESULT
            out.write(b'{"jsonrpc":"2.0","id":' + request_id + b',"result":' + result + b"}\n")
        elif method == b"bench/flood":
            count = json.loads(line)["params"]["count"]
            out.write(NOTE * count)
            out.write(b'{"jsonrpc":"2.0","id":' + request_id + b',"result":{}}\n')
        elif method == b"bench/blank":
            out.write(b"\n" * json.loads(line)["params"]["bytes"])
            out.write(b'{"jsonrpc":"2.0","id":' + request_id + b',"result":{}}\n')
        elif method == b"bench/count":
            out.write(b'{"jsonrpc":"2.0","id":' + request_id + b',"result":%d}\n' % notes)
            notes = 0
        else:
            out.write(b'{"jsonrpc":"2.0","id":' + request_id + b',"result":null}\n')
        out.flush()


if __name__ == "__main__":
    main()
