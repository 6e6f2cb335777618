#!/usr/bin/env node
// k3 serve's page in Debian's chromium, driven by playwright-core, against `k3 serve`
// on the demo model: a message streams in and renders, the reasoning folds, edit, regenerate
// and the conversation kept across a reload, a tool call and its result, stop in the middle
// of a prompt (the server frees the sequence: k3_cancel_layers_max <= 1), the progress bar on
// a prompt of thousands of tokens, the pipeline view's figures during a request, markup in a
// reply shown as text (a canned stream), a refused request's message, the API key asked for,
// and no console errors.
// Every wait is for a condition; the timeouts only bound a hang.
//
//   node page_test.cjs <oracle dir> <out dir for screenshots>     (K3_BIN: the k3 binary)
"use strict";
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { browserOrSkip, tempDir, synthDemo, serve, metric, until } = require("./harness.cjs");
const { cannedStream } = require("./canned_stream.cjs");

const [oracleDir, outDir] = process.argv.slice(2);
const k3 = process.env.K3_BIN;
const WAIT = { timeout: 300000 };
const errors = []; // console errors and uncaught exceptions of every page

function watch(page, name) {
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(`${name}: console: ${m.text()}`);
  });
  page.on("pageerror", (e) => errors.push(`${name}: page error: ${e.message}`));
  return page;
}

async function open(context, url, name) {
  const page = watch(await context.newPage(), name);
  await page.goto(url);
  await page.waitForSelector("body[data-ready='1']", WAIT);
  return page;
}

async function settings(page, values) {
  if (await page.locator("#settings").isHidden()) await page.click("#settings-toggle");
  for (const [id, value] of Object.entries(values)) {
    if (typeof value === "boolean") await page.setChecked(`#${id}`, value);
    else if (id === "set-tool-choice") await page.selectOption(`#${id}`, value);
    else await page.fill(`#${id}`, value);
  }
}

async function idle(page) {
  await page.waitForFunction(() => !document.body.classList.contains("busy"), null, WAIT);
}

async function send(page, text) {
  await page.fill("#input", text);
  await page.click("#send");
}

async function newChat(page) {
  await page.click("#new-chat");
  assert.equal(await page.locator("#messages .message").count(), 0);
}

// Distinct words, so that no prompt resumes another from the prompt cache.
function longPrompt(tag, words) {
  return Array.from({ length: words }, (_, i) => `${tag}${i}`).join(" ");
}

const lastAssistant = (page) => page.locator(".message.assistant").last();

// Both phases of the answer (reasoning, then the reply) last hundreds of tokens, seconds each
// whatever the machine, so that a wait for each sees it; then Stop ends the answer.
async function streamsAndFolds(page) {
  await newChat(page);
  await settings(page, {
    "set-temperature": "0", "set-max-tokens": "1000", "set-thinking": true,
    "set-reasoning-budget": "200", "set-tools": "",
  });
  await send(page, "Hello there");
  // The reasoning streams into an open block, which folds when the reply starts streaming.
  await page.waitForFunction(() => {
    const m = document.querySelector(".message.streaming");
    const d = m?.querySelector("details.reasoning");
    return d?.open && d.querySelector(".reasoning-text").textContent.length > 0 &&
      m.querySelector(".content").textContent.length === 0;
  }, null, WAIT);
  await page.waitForFunction(() => {
    const m = document.querySelector(".message.streaming");
    return m?.querySelector(".content").textContent.length > 0 &&
      !m.querySelector("details.reasoning").open;
  }, null, WAIT);
  await page.click("#stop");
  await idle(page);
  const answer = lastAssistant(page);
  assert.ok((await answer.locator(".content").textContent()).length > 0, "no answer text");
  assert.match(await answer.locator(".stats").textContent(), /stopped/);
  const details = answer.locator("details.reasoning");
  assert.equal(await details.evaluate((d) => d.open), false, "the reasoning is not folded");
  await details.locator("summary").click();
  assert.equal(await details.evaluate((d) => d.open), true, "the reasoning does not open");
}

async function editRegenerateAndStorage(page) {
  await settings(page, { "set-max-tokens": "48", "set-reasoning-budget": "12" });
  const count = await page.locator("#messages .message").count();
  await lastAssistant(page).locator("button.regenerate").click();
  await idle(page);
  assert.equal(await page.locator("#messages .message").count(), count);
  const answer = lastAssistant(page);
  assert.ok((await answer.locator(".content").textContent()).length > 0, "no answer text");
  assert.match(await answer.locator(".stats").textContent(),
    /^prompt \d+ tokens · \d+ cached · first token [\d.]+ s · 48 tokens · [\d.]+ tokens\/s · context [\d.]+% of 16384/);
  await page.locator(".message.user").last().locator("button.edit").click();
  await page.fill(".message.user textarea.edit", "Hello again, edited");
  await page.locator(".edit-form button.save").click();
  await idle(page);
  assert.equal(await page.locator("#messages .message").count(), count);
  assert.equal(await page.locator(".message.user .content").last().textContent(),
    "Hello again, edited");
  const before = await page.locator("#messages").innerText();
  await page.reload();
  await page.waitForSelector("body[data-ready='1']", WAIT);
  assert.equal(await page.locator("#messages").innerText(), before, "not kept across a reload");
  assert.equal(await page.locator("#conversations li.current .title").textContent(),
    "Hello there");
}

async function toolCall(page) {
  const tools = [{
    type: "function",
    function: {
      name: "get_weather", description: "The weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  }];
  await newChat(page);
  await settings(page, {
    "set-tools": JSON.stringify(tools), "set-tool-choice": "required", "set-max-tokens": "200",
  });
  await send(page, "What is the weather in Paris?");
  await idle(page);
  const call = lastAssistant(page).locator(".tool-call");
  assert.equal(await call.count(), 1, "no tool call shown");
  assert.equal(await call.locator(".tool-name").textContent(), "→ get_weather");
  const args = JSON.parse(await call.locator(".tool-args").textContent());
  assert.equal(typeof args.city, "string", "the arguments are not the tool's");
  // The composer sends the next text as the call's result.
  assert.match(await page.getAttribute("#input", "placeholder"), /get_weather/);
  await settings(page, { "set-tool-choice": "none", "set-max-tokens": "16" });
  await send(page, "Sunny, 21 °C");
  await idle(page);
  const result = page.locator(".message.tool .tool-result");
  assert.equal(await result.locator(".tool-name").textContent(), "← get_weather result");
  assert.equal(await result.locator(".tool-output").textContent(), "Sunny, 21 °C");
  assert.equal(await page.locator(".message.assistant").count(), 2);
  await settings(page, { "set-tools": "" });
}

async function stopMidPrompt(page, server) {
  await newChat(page);
  await settings(page, { "set-max-tokens": "16", "set-thinking": false });
  await send(page, longPrompt("s", 1500));
  // Stop in the same turn of the page's loop that sees the prompt part done.
  await page.waitForFunction(() => {
    const p = document.getElementById("progress");
    if (p.hidden || !(Number(p.dataset.processed) < Number(p.dataset.total))) return false;
    document.getElementById("stop").click();
    return true;
  }, null, { ...WAIT, polling: 10 });
  await idle(page);
  assert.match(await lastAssistant(page).locator(".stats").textContent(), /stopped/);
  await until("the server to end the request", async () =>
    (await metric(server.url, 'k3_requests_total{outcome="cancelled"}')) >= 1 &&
    (await metric(server.url, "k3_live_sequences")) === 0);
  const layers = await metric(server.url, "k3_cancel_layers_max");
  assert.ok(layers <= 1, `k3_cancel_layers_max ${layers}`);
}

async function progressBar(page) {
  await newChat(page);
  await page.evaluate(() => {
    window.seen = [];
    const p = document.getElementById("progress");
    new MutationObserver((records) => {
      // Every value the attribute held, in order: each change's old value, then the last.
      for (const r of records) if (r.oldValue !== null) window.seen.push(Number(r.oldValue));
      if (p.dataset.processed !== undefined) window.seen.push(Number(p.dataset.processed));
      if (p.dataset.total !== undefined) window.total = Number(p.dataset.total);
      window.seenText = window.seenText || [];
      window.seenText.push(document.getElementById("progress-text").textContent);
    }).observe(p, { attributes: true, attributeFilter: ["data-processed"], attributeOldValue: true });
  });
  await settings(page, { "set-max-tokens": "4" });
  await send(page, longPrompt("p", 1500));
  // A picture of the bar on the way (whatever it shows when taken; nothing is asserted on it).
  await page.waitForSelector("#progress:not([hidden])", WAIT);
  await page.screenshot({ path: path.join(outDir, "page-chat-progress.png") });
  await idle(page);
  const seen = (await page.evaluate(() => window.seen)).filter((n) => Number.isFinite(n));
  const total = await page.evaluate(() => window.total);
  assert.ok(total >= 2000, `a prompt of ${total} tokens`);
  const partial = [...new Set(seen)].filter((n) => n > 0 && n < total);
  assert.ok(partial.length >= 2, `the bar showed ${JSON.stringify(partial)} of ${total}`);
  for (let i = 1; i < seen.length; ++i) assert.ok(seen[i] >= seen[i - 1], `went backwards: ${seen}`);
  const texts = await page.evaluate(() => window.seenText);
  assert.ok(texts.some((t) => / of \d+ tokens.*left$/.test(t)), `no estimate: ${texts}`);
}

async function pipelineView(context, page, server) {
  const view = await open(context, `${server.url}/pipeline`, "pipeline");
  await view.setViewportSize({ width: 1200, height: 1000 });
  await view.waitForFunction(() => document.querySelectorAll("#pl-plan dt").length > 0, null,
    WAIT);
  const updates = () => view.evaluate(() =>
    Number(document.getElementById("pipeline-view").dataset.updates || 0));
  const start = await updates();
  // Long enough for several updates whatever the machine; stopped once they are seen.
  await settings(page, { "set-max-tokens": "1000", "set-thinking": false });
  await send(page, "Tell me about disks");
  await view.waitForFunction((n) =>
    Number(document.getElementById("pipeline-view").dataset.updates || 0) > n &&
    document.querySelectorAll("#pl-layers tbody tr").length > 0, start, WAIT);
  const first = await view.locator("#pl-step").innerText();
  const firstUpdates = await updates();
  await view.waitForFunction((n) =>
    Number(document.getElementById("pipeline-view").dataset.updates || 0) > n, firstUpdates,
    WAIT);
  assert.notEqual(await view.locator("#pl-step").innerText(), first, "the figures stayed");
  const asked = await view.$$eval("#pl-layers tbody tr td:nth-child(2)",
    (cells) => cells.map((c) => Number(c.textContent)));
  assert.ok(asked.some((n) => n > 0), `no experts asked: ${asked}`);
  // A few seconds of history in the picture.
  await view.waitForFunction(() =>
    Number(document.getElementById("pipeline-view").dataset.updates || 0) >= 12, null, WAIT);
  await view.screenshot({ path: path.join(outDir, "page-pipeline.png") });
  await page.click("#stop");
  await idle(page);
  await view.close();
}

async function markupAsText(browser, server) {
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  let dialogs = 0;
  const page = watch(await context.newPage(), "markup");
  page.on("dialog", (d) => {
    dialogs += 1;
    d.dismiss();
  });
  await page.route("**/v1/chat/completions", (route) => route.fulfill({
    status: 200,
    headers: { "Content-Type": "text/event-stream; charset=utf-8" },
    body: cannedStream(),
  }));
  await page.goto(server.url);
  await page.waitForSelector("body[data-ready='1']", WAIT);
  await send(page, "Show me some markup");
  await idle(page);
  const answer = lastAssistant(page);
  const text = await answer.locator(".content").textContent();
  assert.ok(text.includes("<script>window.pwned = 1</script>"), text);
  assert.ok(text.includes('<img src=x onerror="window.pwned = 2">'), text);
  assert.ok((await answer.locator(".reasoning-text").textContent()).includes("<img"));
  assert.ok((await answer.locator(".tool-args").textContent()).includes("<img src=x"));
  assert.equal(await page.locator("#messages img, #messages script, #messages iframe").count(), 0);
  assert.equal(await page.locator('#messages a[href^="javascript"]').count(), 0);
  assert.equal(await answer.locator("strong").textContent(), "bold");
  assert.equal(await answer.locator("pre code").textContent(), "let x = 1 < 2;\n");
  assert.equal(await page.evaluate(() => window.pwned), undefined, "markup ran");
  assert.equal(dialogs, 0, "a dialog opened");
  await context.close();
}

// A request the server refuses: its message shown, no empty answer left. (The browser logs the
// 400 as a console error itself: this page is not watched.)
async function refusedRequest(browser, server) {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(server.url);
  await page.waitForSelector("body[data-ready='1']", WAIT);
  await settings(page, { "set-temperature": "5" });
  await send(page, "hi");
  await idle(page);
  assert.match(await page.locator("#error").textContent(), /^400: .*temperature/);
  assert.equal(await page.locator("#messages .message").count(), 1);
  assert.equal(await page.locator(".message.assistant").count(), 0);
  await context.close();
}

async function apiKey(browser, k3, dir, model) {
  const server = await serve(k3, dir, ["-m", model, "--prompt-cache", "none",
    "--api-key", "page-test-key"]);
  try {
    const context = await browser.newContext();
    const page = watch(await context.newPage(), "key");
    await page.goto(server.url);
    await page.waitForSelector("#key-dialog[open]", WAIT);
    await page.fill("#key-input", "page-test-key");
    await page.click("#key-form button");
    await settings(page, { "set-max-tokens": "8", "set-thinking": false });
    await send(page, "hi");
    await idle(page);
    assert.equal(await page.locator("#error").isHidden(), true);
    assert.match(await lastAssistant(page).locator(".stats").textContent(), /8 tokens/);
    await context.close();
  } finally {
    await server.stop();
  }
}

async function main() {
  const { chromium, executablePath } = browserOrSkip(oracleDir);
  fs.mkdirSync(outDir, { recursive: true });
  const dir = tempDir();
  const model = synthDemo(k3, dir);
  // Prompts in chunks of 256 tokens (their progress reported after each layer); a budget whose
  // expert cache holds part of the experts, so that the pipeline view shows reads.
  const server = await serve(k3, dir, ["-m", model, "--prompt-cache", "pc",
    "--prefill-chunk", "256", "--max-context", "16384", "--ram-gb", "0.25"]);
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
  const failed = [];
  const check = async (name, fn) => {
    try {
      await fn();
      console.log(`ok - ${name}`);
    } catch (e) {
      failed.push(name);
      console.log(`FAIL - ${name}: ${e.stack || e}`);
    }
  };
  try {
    const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
    const page = await open(context, server.url, "chat");
    await check("a message streams in and the reasoning folds", () => streamsAndFolds(page));
    await check("edit, regenerate, kept across a reload", () => editRegenerateAndStorage(page));
    await page.screenshot({ path: path.join(outDir, "page-chat.png") });
    await check("a tool call and its result", () => toolCall(page));
    await page.screenshot({ path: path.join(outDir, "page-chat-tools.png") });
    await check("stop in the middle of a prompt", () => stopMidPrompt(page, server));
    await check("the progress bar advances", () => progressBar(page));
    await check("the pipeline view's figures change", () => pipelineView(context, page, server));
    await check("markup in a reply is text", () => markupAsText(browser, server));
    await check("a refused request shows why", () => refusedRequest(browser, server));
    await check("the page asks for the API key", () => apiKey(browser, k3, dir, model));
    await check("no console errors", () => assert.deepEqual(errors, []));
  } finally {
    await browser.close();
    await server.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
  if (failed.length) {
    console.log(`${failed.length} failed: ${failed.join("; ")}`);
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
