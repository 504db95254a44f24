// @thinkwell/conductor as a plain stdio relay in front of one agent, for bench/peer_bench.py.
//   node conductor_stdio.mjs AGENT_CMD [ARGS...]   (run from beside the package's node_modules)
// The package connects to the agent itself (StdioConnector spawns it) but has no connector for
// its own stdin/stdout, so the client side is a small ComponentConnector over them.
import { createInterface } from "node:readline";
import { Conductor, StdioConnector, fromConnectors } from "@thinkwell/conductor";

const [agentCommand, ...agentArgs] = process.argv.slice(2);

async function* clientMessages(lines) {
  for await (const line of lines) {
    if (line.trim() === "") continue;
    try {
      yield JSON.parse(line);
    } catch (error) {
      process.stderr.write(`not JSON from the client: ${error}\n`);
    }
  }
}

const ownStdio = {
  async connect() {
    const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
    return {
      send: (message) => process.stdout.write(`${JSON.stringify(message)}\n`),
      messages: clientMessages(lines),
      close: async () => lines.close(),
    };
  },
};

const conductor = new Conductor({
  instantiator: fromConnectors(new StdioConnector({ command: agentCommand, args: agentArgs })),
  mcpBridgeMode: "disabled", // a plain relay: no MCP-over-ACP HTTP listener
});
await conductor.connect(ownStdio);
