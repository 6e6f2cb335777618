// What the browser test needs besides the browser: a temp dir, the demo model, `k3 serve` as a
// child process on a free loopback port, /metrics, and skipping (exit 77) where chromium or
// playwright-core is missing.
"use strict";
const { spawn, spawnSync } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

const SKIP = 77;

function skip(why) {
  console.log(`SKIPPED: ${why}`);
  process.exit(SKIP);
}

// playwright-core from the oracle folder, and the system's chromium; skips without either.
function browserOrSkip(oracleDir) {
  const executablePath = process.env.K3_CHROMIUM || "/usr/bin/chromium";
  if (!fs.existsSync(executablePath)) skip(`no chromium at ${executablePath}`);
  let playwright;
  try {
    playwright = require(require.resolve("playwright-core", { paths: [oracleDir] }));
  } catch {
    skip(`no playwright-core in ${oracleDir} (scripts/setup-deps.sh test)`);
  }
  return { chromium: playwright.chromium, executablePath };
}

function tempDir() {
  return fs.mkdtempSync(path.join(os.tmpdir(), "k3-page-test-"));
}

// `k3 synth --preset demo` into DIR/demo: the demo model of `k3 generate` without --model.
// Its path relative to DIR, where the server runs (the page shows the path; the screenshots
// say "demo").
function synthDemo(k3, dir) {
  const r = spawnSync(k3, ["synth", "--preset", "demo", "--out", "demo", "--quiet"], {
    encoding: "utf8", cwd: dir,
  });
  if (r.status !== 0) throw new Error(`k3 synth failed: ${r.stderr}`);
  return "demo";
}

// `k3 serve --port 0 ARGS` in DIR; resolves with {url, stop, log} once it prints where it
// listens.
function serve(k3, dir, args) {
  const log = path.join(dir, `serve-${Date.now()}.err`);
  const err = fs.openSync(log, "w");
  const child = spawn(k3, ["serve", "--port", "0", ...args], {
    stdio: ["ignore", "ignore", err], cwd: dir,
  });
  // Interrupted (ctest's timeout, Ctrl-C): the server goes with the test.
  for (const signal of ["SIGTERM", "SIGINT"]) {
    process.once(signal, () => {
      child.kill("SIGTERM");
      process.exit(1);
    });
  }
  const stop = () =>
    new Promise((resolve) => {
      if (child.exitCode !== null) return resolve(child.exitCode);
      child.once("exit", (code) => resolve(code));
      child.kill("SIGTERM");
    });
  return new Promise((resolve, reject) => {
    const poll = setInterval(() => {
      const text = fs.readFileSync(log, "utf8");
      const m = /listening on (http:\/\/127\.0\.0\.1:[0-9]+)/.exec(text);
      if (m) {
        clearInterval(poll);
        resolve({ url: m[1], stop, log: () => fs.readFileSync(log, "utf8") });
      } else if (child.exitCode !== null) {
        clearInterval(poll);
        reject(new Error(`k3 serve exited at start: ${text}`));
      }
    }, 50);
  });
}

// The value of a /metrics line (NAME or NAME{labels}).
async function metric(url, name, headers = {}) {
  const text = await (await fetch(`${url}/metrics`, { headers })).text();
  for (const line of text.split("\n")) {
    const [key, value] = line.split(" ");
    if (key === name) return Number(value);
  }
  throw new Error(`no ${name} in /metrics`);
}

// Polls `check` (async, truthy when done) until it holds; the timeout only bounds a hang.
async function until(what, check, timeoutMs = 300000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

module.exports = { browserOrSkip, tempDir, synthDemo, serve, metric, until };
