// Stamp the build with the hash of the sources it was built from (hub/viewer/build.py
// computes the same hash; `python3 -m hub.viewer --check` compares them).
import { createHash } from "node:crypto";
import { readFileSync, readdirSync, statSync, writeFileSync, existsSync } from "node:fs";
import { join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";

// Arguments (tests): the web directory and the output file; default this web/ and
// hub/viewer/static/build.json.
const web = process.argv[2] ?? fileURLToPath(new URL("..", import.meta.url));
const TOP = ["index.html", "package.json", "package-lock.json", "tsconfig.json", "vite.config.ts"];

function walk(dir) {
  const out = [];
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) out.push(...walk(path));
    else if (!name.endsWith(".test.ts") && !name.endsWith(".test.tsx")) out.push(path);
  }
  return out;
}

const files = TOP.map((n) => join(web, n)).filter((p) => existsSync(p));
files.push(...walk(join(web, "src")));
const rel = (p) => relative(web, p).split(sep).join("/");
// Sort by UTF-8 code units, as Python sorts str.
files.sort((a, b) => (rel(a) < rel(b) ? -1 : rel(a) > rel(b) ? 1 : 0));
const outer = createHash("sha256");
for (const path of files) {
  const digest = createHash("sha256").update(readFileSync(path)).digest("hex");
  outer.update(`${rel(path)}\0${digest}\n`);
}
const sourceHash = outer.digest("hex");
writeFileSync(
  process.argv[3] ?? join(web, "..", "hub", "viewer", "static", "build.json"),
  JSON.stringify({ sourceHash, files: files.length }, null, 2) + "\n",
);
console.log(`stamped build.json: ${sourceHash}`);
