// The viewer is served by `agora serve` under /ui/; the build goes into the Python package so
// `pip install` ships it (hub/viewer/static, checked against these sources by
// `python3 -m hub.viewer --check`).
import { defineConfig } from "vite";

export default defineConfig({
  base: "/ui/",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: {
    outDir: "../hub/viewer/static",
    emptyOutDir: true,
    target: "es2022",
    sourcemap: false,
    chunkSizeWarningLimit: 300,
  },
  test: { include: ["src/**/*.test.ts"], environment: "node" },
} as never);
