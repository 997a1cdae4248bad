// Run by browser.test.mjs under `node --experimental-websocket`: the client over the global
// (WHATWG, browser) WebSocket instead of `ws`. Prints one JSON line.
import { connect } from "../../dist/index.js";

const [url, token, workspace] = process.argv.slice(2);
const factory = (u, protocols) => new globalThis.WebSocket(u, protocols);
const session = await connect(url, token, { socketFactory: factory });
const ws = session.workspace(workspace);
const ack = await ws.postMessage("from the browser API");
const events = await ws.events(0);
await ws.writeFile("b.bin", new Uint8Array([1, 2, 3]), 0);
const bytes = [...(await ws.readFile("b.bin"))];
await session.close();
process.stdout.write(
  `${JSON.stringify({ agent: session.agent, seq: ack.seq, kinds: events.map((e) => e.kind), bytes })}\n`,
);
