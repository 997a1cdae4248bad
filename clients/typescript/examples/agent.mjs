#!/usr/bin/env node
// A small TypeScript-client agent that a test (or a shell) drives:
//
//   node examples/agent.mjs URL TOKEN WORKSPACE ACTION [JSON-ARGS]
//
// It connects, does one ACTION, prints one JSON line (the result) on stdout and exits 0; on an
// error it prints {"error": code, "message": …, "details": …} and exits 1. Build the package
// first (`npm ci && npm run build` in clients/typescript). Actions and their JSON arguments:
//
//   post          {text}                              -> {seq, id}
//   request-work  {topic, payload?}                   -> {correlationId, seq}
//   serve-work    {topic?, timeout?, file?: {path, text}, result?, feedback?: bool}
//                 wait for open work (reading the log first), claim it, optionally write a
//                 file, optionally ask for feedback and wait for it, publish `result`,
//                 complete it                          -> {correlationId, claimed, published,
//                                                          completed, file?, feedback?}
//   wait-work     {topic?, timeout?}                  -> the open needWork event
//   claim | publish-work | request-feedback | provide-feedback | block | complete | cancel
//                 {correlationId, payload?}           -> the stored event
//   wait-kind     {correlationId, kind, timeout?, afterSeq?} -> the event
//   write-file    {path, text, baseRev?}              -> {seq, rev}
//   read-file     {path}                              -> {text} or {base64}
//   state         {}                                  -> the workspace state
//   events        {afterSeq?}                         -> [events]
//   exec          {source, backend?}                  -> the result (utf8)
import { AgoraError, connect } from "../dist/index.js";

const [url, token, workspace, action, rawArgs] = process.argv.slice(2);
if (!url || !token || !workspace || !action) {
  console.error("usage: agent.mjs URL TOKEN WORKSPACE ACTION [JSON-ARGS]");
  process.exit(2);
}
const args = rawArgs ? JSON.parse(rawArgs) : {};

async function serveWork(ws) {
  const item = await ws.waitForWork(args.topic, { timeout: args.timeout ?? 30 });
  const cid = item.correlationId;
  const out = { correlationId: cid };
  out.claimed = (await ws.claimWork(cid, { by: ws.session.agent })).seq;
  if (args.file) {
    const state = await ws.state({ paths: [args.file.path] });
    const rev = state.files?.[args.file.path]?.rev ?? 0;
    out.file = (await ws.writeFile(args.file.path, args.file.text, rev)).seq;
  }
  if (args.feedback) {
    const asked = await ws.requestFeedback(cid, { question: "ok?" });
    const answer = await ws.waitForFeedback(cid, {
      timeout: args.timeout ?? 30,
      afterSeq: asked.seq,
    });
    out.feedback = answer.payload;
  }
  out.published = (await ws.publishWork(cid, args.result ?? { ok: true })).seq;
  out.completed = (await ws.signalCompleted(cid)).seq;
  return out;
}

async function run(ws) {
  switch (action) {
    case "post": {
      const ev = await ws.postMessage(args.text ?? "");
      return { seq: ev.seq, id: ev.id };
    }
    case "request-work": {
      const ev = await ws.requestWork(args.topic, args.payload);
      return { correlationId: ev.correlationId, seq: ev.seq };
    }
    case "serve-work":
      return serveWork(ws);
    case "wait-work":
      return ws.waitForWork(args.topic, { timeout: args.timeout ?? 30 });
    case "claim":
      return ws.claimWork(args.correlationId, args.payload);
    case "publish-work":
      return ws.publishWork(args.correlationId, args.payload);
    case "request-feedback":
      return ws.requestFeedback(args.correlationId, args.payload);
    case "provide-feedback":
      return ws.provideFeedback(args.correlationId, args.payload);
    case "block":
      return ws.signalBlocked(args.correlationId, args.payload);
    case "complete":
      return ws.signalCompleted(args.correlationId, args.payload);
    case "cancel":
      return ws.cancelWork(args.correlationId, args.payload);
    case "wait-kind":
      return ws.waitForKind(args.correlationId, args.kind, {
        timeout: args.timeout ?? 30,
        afterSeq: args.afterSeq,
      });
    case "write-file": {
      const ev = await ws.writeFile(args.path, args.text, args.baseRev);
      const state = await ws.state({ paths: [args.path] });
      return { seq: ev.seq, rev: state.files?.[args.path]?.rev };
    }
    case "read-file": {
      const content = await ws.readFile(args.path);
      return typeof content === "string"
        ? { text: content }
        : { base64: Buffer.from(content).toString("base64") };
    }
    case "state":
      return ws.state();
    case "events":
      return ws.events(args.afterSeq ?? 0);
    case "exec": {
      const handle = await ws.runtime.exec(args.source, { backend: args.backend });
      return handle.result();
    }
    default:
      throw new Error(`unknown action ${action}`);
  }
}

let session;
try {
  session = await connect(url, token);
  const result = await run(session.workspace(workspace));
  process.stdout.write(`${JSON.stringify(result)}\n`);
  await session.close();
  process.exit(0);
} catch (e) {
  const error =
    e instanceof AgoraError
      ? { error: e.code, message: e.message, details: e.details }
      : { error: e?.name ?? "Error", message: String(e?.message ?? e), details: {} };
  process.stdout.write(`${JSON.stringify(error)}\n`);
  await session?.close();
  process.exit(1);
}
