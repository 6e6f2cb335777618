#!/usr/bin/env node
// The real client for serve_test: the official OpenAI Node SDK (npm package `openai`, installed
// into <build dir>/oracle by scripts/setup-deps.sh), talking to a running `k3 serve`.
//
//   node serve_client.cjs <oracle dir> <base url> <requests.json> <out.json>
//
// requests.json: [{"endpoint": "chat" | "completions", "params": {...}, "api_key": "...",
//                  "abort_after_chunks": N}, ...], all sent at once. params go to the SDK as
// they are (stream, stream_options, return_token_ids included). abort_after_chunks stops a
// stream after N chunks, as a client that goes away. "assemble": true streams through the SDK's
// own assembler (client.beta.chat.completions.stream and finalChatCompletion), which checks
// the chunks of tool calls as OpenAI sends them. out.json holds one result per request:
// {"ok": true, "content", "reasoning", "token_ids", "prompt_token_ids", "finish_reason",
//  "usage", "chunks", "done", "tool_calls", "validation"} or {"ok": false, "status", "error":
// {...}, "class"}. "validation" checks with ajv (a JSON-schema validator from npm) each tool
// call's arguments against its tool's `parameters`, and the content against a json_schema
// response format: [{"name", "valid", "errors"}].
"use strict";
const { failure, main } = require("./client_main.cjs");

const [oracleDir, baseURL, requestsPath, outPath] = process.argv.slice(2);
const OpenAI = require(require.resolve("openai", { paths: [oracleDir] })).default;
const Ajv = require(require.resolve("ajv", { paths: [oracleDir] })).default;

function check(schema, text, name) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { name, valid: false, errors: "not JSON: " + String(e.message) + ": " + text };
  }
  const validate = new Ajv({ strict: false }).compile(schema);
  const valid = validate(value);
  return { name, valid, errors: valid ? null : validate.errors, value };
}

// Each tool call's arguments against its declared schema; the content against a json_schema.
function validation(params, out) {
  const checks = [];
  for (const call of out.tool_calls || []) {
    const tool = (params.tools || []).find((t) => t.function.name === call.function.name);
    if (!tool) {
      checks.push({ name: call.function.name, valid: false, errors: "undeclared tool" });
    } else {
      checks.push(check(tool.function.parameters || {}, call.function.arguments, call.function.name));
    }
  }
  const format = params.response_format;
  if (format && format.type === "json_schema") {
    checks.push(check(format.json_schema.schema, out.content, "response_format"));
  } else if (format && format.type === "json_object") {
    checks.push(check({ type: "object" }, out.content, "response_format"));
  }
  return checks;
}

// The SDK's stream assembler: it merges delta.tool_calls by index as OpenAI sends them.
async function assembled(client, req, out) {
  const stream = client.beta.chat.completions.stream(req.params);
  stream.on("chunk", () => { out.chunks += 1; });
  const r = await stream.finalChatCompletion();
  const c = r.choices[0];
  out.content = c.message.content || "";
  out.reasoning = c.message.reasoning_content || "";
  out.tool_calls = c.message.tool_calls || [];
  out.finish_reason = c.finish_reason;
  out.usage = r.usage;
  out.done = true;
  out.validation = validation(req.params, out);
  return out;
}

async function run(req) {
  const client = new OpenAI({ baseURL, apiKey: req.api_key || "unused", maxRetries: 0 });
  const api = req.endpoint === "chat" ? client.chat.completions : client.completions;
  const out = { ok: true, content: "", reasoning: "", token_ids: [], chunks: 0, done: false };
  try {
    if (req.assemble) return await assembled(client, req, out);
    if (!req.params.stream) {
      const r = await api.create(req.params);
      const c = r.choices[0];
      out.content = req.endpoint === "chat" ? c.message.content : c.text;
      out.reasoning = (c.message && c.message.reasoning_content) || "";
      out.tool_calls = (c.message && c.message.tool_calls) || [];
      out.token_ids = c.token_ids || [];
      out.prompt_token_ids = c.prompt_token_ids || [];
      out.finish_reason = c.finish_reason;
      out.usage = r.usage;
      out.object = r.object;
      out.done = true;
      if (req.endpoint === "chat") out.validation = validation(req.params, out);
      return out;
    }
    const stream = await api.create(req.params);
    for await (const chunk of stream) {
      out.chunks += 1;
      out.object = chunk.object;
      if (chunk.usage) out.usage = chunk.usage;
      for (const c of chunk.choices) {
        const d = req.endpoint === "chat" ? c.delta : c;
        out.content += (req.endpoint === "chat" ? d.content : d.text) || "";
        out.reasoning += (d && d.reasoning_content) || "";
        if (c.token_ids) out.token_ids.push(...c.token_ids);
        if (c.prompt_token_ids) out.prompt_token_ids = c.prompt_token_ids;
        if (c.finish_reason) out.finish_reason = c.finish_reason;
      }
      if (req.abort_after_chunks && out.chunks >= req.abort_after_chunks) {
        stream.controller.abort();
        out.aborted = true;
        return out;
      }
    }
    out.done = true;  // the SDK saw data: [DONE]
    return out;
  } catch (e) {
    if (out.aborted) return out;
    return failure(e);
  }
}

main(requestsPath, outPath, run);
