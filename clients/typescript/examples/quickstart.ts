// The README's quick start, type-checked against the built declarations by `npm test`
// (`tsc -p tsconfig.examples.json`), so the documented API stays what the package declares;
// compile it or copy it into your project.
import { Conflict, connect, type WorkspaceState } from "@agora-hub/client";

export async function quickstart(url: string, token: string): Promise<WorkspaceState> {
  const session = await connect(url, token);
  const ws = session.workspace("demo");

  const ack = await ws.publish({ kind: "messagePosted", payload: { text: "hello" } });

  await ws.writeFile("src/a.txt", "one", 0);
  try {
    await ws.writeFile("src/a.txt", "lost update", 0);
  } catch (e) {
    if (e instanceof Conflict) console.log("current rev", e.details.rev);
  }

  const item = await ws.requestWork("parser", { spec: "…" });
  const reply = await ws.waitForKind(item.correlationId!, "workPublished", { timeout: 60 });
  console.log(reply.payload);

  for await (const ev of ws.subscribe(0)) {
    console.log(ev.seq, ev.kind, ev.producer);
    if (ev.seq >= ack.seq) break;
  }
  const handle = await ws.runtime.exec("echo hi", { backend: "process" });
  for await (const update of handle.events()) console.log(update.event.kind, update.text);
  const state = await ws.state();
  await session.close();
  return state;
}
