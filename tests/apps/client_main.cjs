// What the Node clients of k3 serve's tests (serve_client.cjs, anthropic_client.cjs) share:
// an SDK error as a result, and the run of every request of requests.json at once into
// out.json.
"use strict";
const fs = require("fs");

// An SDK's APIError (or any other) as the result the C++ tests read.
function failure(e) {
  return { ok: false, status: e.status, error: e.error, class: e.constructor.name,
           message: String(e.message) };
}

// Runs `run` on each request at once; exits 1 if the script itself fails.
function main(requestsPath, outPath, run) {
  (async () => {
    const requests = JSON.parse(fs.readFileSync(requestsPath, "utf8"));
    const results = await Promise.all(requests.map(run));
    fs.writeFileSync(outPath, JSON.stringify(results));
  })().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { failure, main };
