"""The JavaScript the ``javascript`` backend ships into every Deno sandbox (kept as text here so
the package needs no data files): the entry module and the ``agora:workspace`` host module.

Both speak the backend's channel (:mod:`backends.javascript.channel`): one JSON object per line
over the run's Unix socket, each request ``{"id", "op", ...}`` answered by ``{"id", "ok"}`` or
``{"id", "error": {"name", "message"}}``.

The entry module (:data:`RUNNER`) asks for the run (``start``: source, language, input), imports
the source as a ``data:`` module — so a static ``import "file:///…"`` in it needs a read
permission the sandbox does not have, where an entry file's static imports would be loaded
without one — calls its default export with the input, and reports the JSON value (``result``)
or the error (``error``) before exiting. :data:`WORKSPACE` implements ``readFile``,
``writeFile``, ``listFiles`` and ``deleteFile`` as calls over its own connection.
"""

from __future__ import annotations

from typing import Final

__all__ = ["RUNNER", "SOCKET", "WORKSPACE"]

SOCKET: Final = "/run/agora/host.sock"
"""Where the run's channel socket is inside the sandbox."""

# Shared by both modules: a line-delimited JSON client over one Unix socket connection.
_CLIENT: Final = """
const __agoraSocket = %(socket)s;
class __AgoraChannel {
  #conn = null; #next = 1; #pending = new Map(); #reading = false;
  async #connect() {
    if (this.#conn === null) {
      this.#conn = await Deno.connect({ transport: "unix", path: __agoraSocket });
    }
    return this.#conn;
  }
  async #read() {
    const decoder = new TextDecoder();
    const buf = new Uint8Array(65536);
    let text = "";
    this.#reading = true;
    try {
      for (;;) {
        const n = await this.#conn.read(buf);
        if (n === null) break;
        text += decoder.decode(buf.subarray(0, n), { stream: true });
        let nl;
        while ((nl = text.indexOf("\\n")) >= 0) {
          const reply = JSON.parse(text.slice(0, nl));
          text = text.slice(nl + 1);
          const waiter = this.#pending.get(reply.id);
          if (waiter !== undefined) {
            this.#pending.delete(reply.id);
            waiter(reply);
          }
        }
      }
    } finally {
      this.#reading = false;
      for (const waiter of this.#pending.values()) {
        waiter({ error: { name: "Interrupted", message: "the host channel closed" } });
      }
      this.#pending.clear();
    }
  }
  async call(op, fields) {
    const conn = await this.#connect();
    const id = this.#next++;
    const answer = new Promise((resolve) => this.#pending.set(id, resolve));
    const line = JSON.stringify({ ...fields, id, op }) + "\\n";
    const data = new TextEncoder().encode(line);
    for (let off = 0; off < data.length;) off += await conn.write(data.subarray(off));
    if (!this.#reading) this.#read().catch(() => {});
    const reply = await answer;
    if (reply.error !== undefined) {
      const { name, message } = reply.error;
      const known = {
        PermissionDenied: Deno.errors.PermissionDenied,
        NotFound: Deno.errors.NotFound,
        IsADirectory: Deno.errors.IsADirectory,
        Interrupted: Deno.errors.Interrupted,
        TimedOut: Deno.errors.TimedOut,
        TypeError: TypeError,
        RangeError: RangeError,
      }[name] ?? Error;
      throw new known(message);
    }
    return reply.ok;
  }
}
"""

WORKSPACE: Final = (
    _CLIENT % {"socket": '"' + SOCKET + '"'}
    + """
const channel = new __AgoraChannel();
function path(p) {
  if (typeof p !== "string") throw new TypeError("path must be a string");
  return p;
}
/** The file's text (UTF-8; invalid bytes become U+FFFD). */
export async function readFile(p) {
  return await channel.call("readFile", { path: path(p) });
}
/** Create or replace a file with a string (UTF-8) or bytes; resolves to the bytes written. */
export async function writeFile(p, content) {
  if (typeof content === "string") {
    return await channel.call("writeFile", { path: path(p), text: content });
  }
  if (content instanceof Uint8Array) {
    let binary = "";
    for (let i = 0; i < content.length; i += 32768) {
      binary += String.fromCharCode(...content.subarray(i, i + 32768));
    }
    return await channel.call("writeFile", { path: path(p), base64: btoa(binary) });
  }
  throw new TypeError("writeFile: content must be a string or a Uint8Array");
}
/** Every file path at or below the prefix (default: the whole workspace), sorted. */
export async function listFiles(prefix = ".") {
  return await channel.call("listFiles", { path: path(prefix) });
}
/** Remove a file. */
export async function deleteFile(p) {
  await channel.call("deleteFile", { path: path(p) });
}
"""
)

RUNNER: Final = (
    _CLIENT % {"socket": '"' + SOCKET + '"'}
    + """
const channel = new __AgoraChannel();
const run = await channel.call("start", {});
const mime = run.language === "typescript" ? "application/typescript" : "text/javascript";
const bytes = new TextEncoder().encode(run.source);
let binary = "";
for (let i = 0; i < bytes.length; i += 32768) {
  binary += String.fromCharCode(...bytes.subarray(i, i + 32768));
}
const url = `data:${mime};base64,${btoa(binary)}`;
const shown = run.language === "typescript" ? "main.ts" : "main.js";
const tidy = (text) => String(text).replaceAll(url, shown);
async function fail(kind, e) {
  const name = e?.name ?? "Error";
  const message = tidy(e?.message ?? String(e));
  const stack = tidy(e?.stack ?? `${name}: ${message}`);
  console.error(stack);
  await channel.call("error", { kind, name, message });
  Deno.exit(1);
}
let module;
try {
  module = await import(url);
} catch (e) {
  const text = String(e?.message ?? e);
  const parse = e instanceof SyntaxError || /^SyntaxError|could not be parsed/.test(text);
  await fail(parse ? "compile" : "exception", e);
}
let value;
try {
  const main = module.default;
  value = typeof main === "function" ? await main(run.hasInput ? run.input : undefined) : main;
} catch (e) {
  await fail("exception", e);
}
let encoded;
try {
  encoded = value === undefined ? undefined : JSON.stringify(value);
} catch (e) {
  encoded = null;
}
if (encoded === undefined) {
  await channel.call("result", {});
} else if (encoded === null) {
  await channel.call("result", { repr: tidy(Deno.inspect(value)) });
} else {
  await channel.call("result", { json: encoded });
}
Deno.exit(0);
"""
)
