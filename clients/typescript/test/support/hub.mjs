// A real `agora serve` for the node tests, started as a user runs it (the twin of
// tests/support/hub.py): a free port (kept for restart()), a temporary data directory, the
// A2A listener off, AGORA_SECRET set. `PYTHON` names the interpreter (the pytest wrapper sets
// it to its own), the repository is two levels up.
import { spawn } from "node:child_process";
import { createHmac, randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  "..",
  "..",
  "..",
  "..",
);
export const SECRET = "agora-ts-test-secret-0123456789-abcdefghijklmnop";
const PYTHON = process.env.PYTHON || "python3";
const BANNER = /agora serving (ws:\/\/\S+) \(data (.*)\)/;
const BANNER_TIMEOUT_MS = 60_000;

// Hubs still running when this process exits (a test that crashed) are killed with it.
const running = new Set();
process.on("exit", () => {
  for (const proc of running) proc.kill("SIGKILL");
});

function b64url(data) {
  return Buffer.from(data).toString("base64url");
}

/** A capability token (HS256 JWT) signed with `secret`, as `agora token issue` mints it. */
export function mint(
  agent,
  {
    workspaces = ["*"],
    rights = ["read", "write"],
    backends = [],
    ttl = 3600,
    secret = SECRET,
  } = {},
) {
  const now = Math.floor(Date.now() / 1000);
  const header = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const claims = b64url(
    JSON.stringify({
      sub: agent,
      iat: now,
      exp: now + ttl,
      jti: randomBytes(12).toString("base64url").replace(/^-/, "x"),
      workspaces,
      rights,
      backends,
    }),
  );
  const signature = createHmac("sha256", secret).update(`${header}.${claims}`).digest("base64url");
  return `${header}.${claims}.${signature}`;
}

export class Hub {
  constructor(root, config) {
    this.root = root;
    this.data = path.join(root, "data");
    this.config = config;
    this.port = 0;
    this.url = "";
    this.proc = null;
    this.stderr = "";
    this.killed = false; // its last run ended with SIGKILL: nothing removed its warm containers
  }

  async start() {
    const argv = [
      "-m",
      "hub",
      "serve",
      "--port",
      String(this.port),
      "--data",
      this.data,
      "--no-a2a",
    ];
    if (this.config !== undefined) {
      const file = path.join(this.root, "agora.toml");
      await writeFile(file, this.config);
      argv.push("--config", file);
    }
    const env = { ...process.env, AGORA_SECRET: SECRET };
    env.PYTHONPATH = [REPO, process.env.PYTHONPATH].filter(Boolean).join(path.delimiter);
    this.killed = false; // (a start sweeps what the last run left)
    const proc = spawn(PYTHON, argv, { cwd: REPO, env, stdio: ["ignore", "pipe", "pipe"] });
    this.proc = proc;
    running.add(proc);
    proc.once("exit", () => running.delete(proc));
    proc.stderr.on("data", (chunk) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-6000);
    });
    const url = await new Promise((resolve, reject) => {
      let out = "";
      const timer = setTimeout(
        () => reject(new Error(`no banner: ${this.stderr}`)),
        BANNER_TIMEOUT_MS,
      );
      proc.stdout.on("data", (chunk) => {
        out += chunk.toString();
        const m = BANNER.exec(out);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]);
        }
      });
      proc.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`agora serve exited ${code}: ${this.stderr}`));
      });
    });
    this.url = url;
    this.port = Number(url.split(":").pop());
    return this;
  }

  /** SIGKILL (a crash) or SIGTERM (a shutdown: 1001), and wait for the exit. */
  async stop(signal = "SIGTERM") {
    const proc = this.proc;
    if (proc === null || proc.exitCode !== null || proc.signalCode !== null) return null;
    const exited = new Promise((resolve) => proc.once("exit", (code, sig) => resolve(code ?? sig)));
    proc.kill(signal);
    const result = await exited;
    this.proc = null;
    this.killed = signal === "SIGKILL";
    return result;
  }

  /** Start again on the same port and data directory. */
  restart() {
    return this.start();
  }

  token(agent = "alice", options = {}) {
    return mint(agent, options);
  }

  async close() {
    if (this.killed) {
      // A killed hub's containers are swept by its next start: start it once more, so the
      // suite leaves nothing on the Docker engine (best effort: its port may be taken).
      await this.start().catch(() => {});
    }
    await this.stop("SIGTERM");
    await rm(this.root, { recursive: true, force: true });
  }
}

export async function startHub(config) {
  const root = await mkdtemp(path.join(tmpdir(), "agora-ts-"));
  return new Hub(root, config).start();
}

let counter = 0;
/** A fresh workspace name per test. */
export function name(prefix = "ts") {
  counter += 1;
  return `${prefix}-${process.pid}-${counter}-${randomBytes(3).toString("hex")}`;
}
