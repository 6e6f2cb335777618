#!/usr/bin/env node
// The reference tokenizer for tokenizer_parity_test: the npm package `tiktoken` (a WebAssembly
// build of OpenAI's Rust tokenizer), with any rank table and pat_str. <oracle dir> is the
// directory whose node_modules holds the package (scripts/setup-deps.sh: <build dir>/oracle).
//
//   node oracle.cjs export <oracle dir> <out dir>
//     Writes the o200k_base ranks that ship with the package as <out>/tiktoken.model (one
//     "<base64> <rank>" line per token, sampled against the package's own decoder), its
//     special tokens as <out>/tokenizer_config.json, and <out>/patterns.json with the pat_str
//     of every encoding in the package.
//
//   node oracle.cjs encode <oracle dir> <request.json> <out.json>
//     request: {"model": path of a tiktoken.model, "pat_str": "...",
//               "special_tokens": {"<text>": id, ...}, "corpus": path of a corpus JSON}
//     out: {"ordinary": [[ids]...], "all_special": [[ids]...],
//           "invalid_ordinary": [[ids]...], "invalid_all_special": [[ids]...]}
//     "ordinary" uses encode_ordinary (special-token text is plain text); "all_special" uses
//     encode(text, "all"). The corpus's invalid UTF-8 byte strings are first decoded by
//     TextDecoder, which replaces each maximal ill-formed subsequence by U+FFFD.
"use strict";
const fs = require("fs");
const path = require("path");

// `root` is the directory whose node_modules holds tiktoken (<build dir>/oracle).
function encodersDir(root) {
  return path.dirname(require.resolve("tiktoken/encoders/o200k_base.json", { paths: [root] }));
}

function loadTiktoken(root) {
  return require(require.resolve("tiktoken/lite", { paths: [root] })).Tiktoken;
}

// The package stores ranks either as tiktoken.model lines or compactly: a line
// "! <first rank> <base64> <base64> ..." gives consecutive ranks.
function parseRanks(bpeRanks) {
  const ranks = [];
  for (const line of bpeRanks.split("\n")) {
    if (!line) continue;
    const fields = line.split(" ");
    if (fields[0] === "!") {
      const first = Number(fields[1]);
      for (let i = 2; i < fields.length; i++) ranks.push([fields[i], first + i - 2]);
    } else {
      ranks.push([fields[0], Number(fields[1])]);
    }
  }
  return ranks;
}

function exportO200k(root, outDir) {
  const encoders = encodersDir(root);
  const o200k = JSON.parse(fs.readFileSync(path.join(encoders, "o200k_base.json"), "utf8"));
  const ranks = parseRanks(o200k.bpe_ranks);
  const Tiktoken = loadTiktoken(root);
  const enc = new Tiktoken(o200k.bpe_ranks, o200k.special_tokens, o200k.pat_str);
  const lines = [];
  for (const [b64, rank] of ranks) {
    // A sample is enough to catch a misread format, and keeps the export fast.
    if (rank % 7 === 0 || rank < 512) {
      const expected = Buffer.from(enc.decode_single_token_bytes(rank)).toString("base64");
      if (expected !== b64) throw new Error(`rank ${rank}: ${b64}, the decoder says ${expected}`);
    }
    lines.push(`${b64} ${rank}\n`);
  }
  enc.free();
  fs.writeFileSync(path.join(outDir, "tiktoken.model"), lines.join(""));
  const decoder = {};
  for (const [content, id] of Object.entries(o200k.special_tokens)) {
    decoder[String(id)] = { content, special: true };
  }
  fs.writeFileSync(path.join(outDir, "tokenizer_config.json"),
                   JSON.stringify({ added_tokens_decoder: decoder }));
  const patterns = {};
  for (const file of fs.readdirSync(encoders)) {
    if (!file.endsWith(".json")) continue;
    patterns[file.replace(/\.json$/, "")] =
        JSON.parse(fs.readFileSync(path.join(encoders, file), "utf8")).pat_str;
  }
  fs.writeFileSync(path.join(outDir, "patterns.json"), JSON.stringify(patterns));
}

function encode(root, requestPath, outPath) {
  const request = JSON.parse(fs.readFileSync(requestPath, "utf8"));
  const corpus = JSON.parse(fs.readFileSync(request.corpus, "utf8"));
  const Tiktoken = loadTiktoken(root);
  const enc = new Tiktoken(fs.readFileSync(request.model, "utf8"), request.special_tokens,
                           request.pat_str);
  const decoder = new TextDecoder("utf-8");
  const invalid = (corpus.invalid_utf8_hex || []).map((h) => decoder.decode(Buffer.from(h, "hex")));
  const out = {
    ordinary: corpus.strings.map((s) => Array.from(enc.encode_ordinary(s))),
    all_special: corpus.strings.map((s) => Array.from(enc.encode(s, "all"))),
    invalid_ordinary: invalid.map((s) => Array.from(enc.encode_ordinary(s))),
    invalid_all_special: invalid.map((s) => Array.from(enc.encode(s, "all"))),
  };
  enc.free();
  fs.writeFileSync(outPath, JSON.stringify(out));
}

const [command, ...args] = process.argv.slice(2);
if (command === "export" && args.length === 2) {
  exportO200k(...args);
} else if (command === "encode" && args.length === 3) {
  encode(...args);
} else {
  process.stderr.write(
      "usage: oracle.cjs export ORACLE_DIR OUT_DIR | encode ORACLE_DIR REQUEST OUT\n");
  process.exit(2);
}
