#!/usr/bin/env node
// The real client for serve_anthropic_test: Anthropic's TypeScript SDK (npm package
// `@anthropic-ai/sdk`, installed into <build dir>/oracle by scripts/setup-deps.sh), talking
// to a running `k3 serve` through its Messages API.
//
//   node anthropic_client.cjs <oracle dir> <base url> <requests.json> <out.json>
//
// requests.json: [{"call": "create" | "stream" | "count", "params": {...}, "api_key": "..."}],
// all sent at once. "create" is client.messages.create (params.stream unset), "stream" the
// SDK's own stream helper (client.messages.stream(...).finalMessage(), which assembles the
// events as Anthropic sends them), "count" client.messages.countTokens. out.json holds one
// result per request: {"ok": true, "message", "events", "validation"} or {"ok": false,
// "status", "error", "class", "message"}. "validation" checks with ajv each tool_use block's
// input against its tool's input_schema: [{"name", "valid", "errors"}].
// "agent" runs an agent's loop of `turns` turns with the SDK: each answer goes back into the
// history with a tool_result for each of its tool_use blocks, and the next turn is asked;
// its result is {"ok": true, "turns": [{"usage", "stop_reason", "validation",
// "prompt_token_ids" (with params.return_token_ids)}]}.
"use strict";
const { failure, main } = require("./client_main.cjs");

const [oracleDir, baseURL, requestsPath, outPath] = process.argv.slice(2);
const sdk = require(require.resolve("@anthropic-ai/sdk", { paths: [oracleDir] }));
const Anthropic = sdk.default || sdk.Anthropic;
const Ajv = require(require.resolve("ajv", { paths: [oracleDir] })).default;

function validation(params, message) {
  const checks = [];
  for (const block of message.content || []) {
    if (block.type !== "tool_use") continue;
    const tool = (params.tools || []).find((t) => t.name === block.name);
    if (!tool) {
      checks.push({ name: block.name, valid: false, errors: "undeclared tool" });
      continue;
    }
    const validate = new Ajv({ strict: false }).compile(tool.input_schema);
    const valid = validate(block.input);
    checks.push({ name: block.name, valid, errors: valid ? null : validate.errors });
  }
  return checks;
}

async function agent(client, req) {
  const params = JSON.parse(JSON.stringify(req.params));
  const turns = [];
  for (let turn = 0; turn < req.turns; ++turn) {
    const message = await client.messages.create(params);
    turns.push({ usage: message.usage, stop_reason: message.stop_reason,
                 validation: validation(params, message),
                 prompt_token_ids: message.prompt_token_ids });
    params.messages.push({ role: "assistant", content: message.content });
    const results = message.content.filter((b) => b.type === "tool_use").map((b) => (
      { type: "tool_result", tool_use_id: b.id, content: `result ${turn} of ${b.name}` }));
    params.messages.push({ role: "user", content: results.length ? results : "Go on." });
  }
  return { ok: true, turns };
}

async function run(req) {
  const client = new Anthropic({ baseURL, apiKey: req.api_key || "unused", maxRetries: 0 });
  const out = { ok: true, events: [] };
  try {
    if (req.call === "agent") return await agent(client, req);
    if (req.call === "count") {
      out.message = await client.messages.countTokens(req.params);
      return out;
    }
    if (req.call === "stream") {
      const stream = client.messages.stream(req.params);
      stream.on("streamEvent", (event) => { out.events.push(event.type); });
      out.message = await stream.finalMessage();
    } else {
      out.message = await client.messages.create(req.params);
    }
    out.validation = validation(req.params, out.message);
    return out;
  } catch (e) {
    return failure(e);
  }
}

main(requestsPath, outPath, run);
