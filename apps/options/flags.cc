// The flags of `k3`: every definition, then the table of which commands take each. Add a flag
// here, with its row; a flag without a row is refused everywhere (FlagsTest checks that every
// flag has one).
#include "apps/options/flags.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "pipeline/cache/policy.h"
#include "pipeline/cache/replay.h"
#include "pipeline/engine.h"

namespace {

// The engine's flags take their defaults from EngineOptions, the one place they are written
// (--help shows them; FlagsTest checks each against it).
const k3::EngineOptions& EngineDefaults() {
  static const k3::EngineOptions options;
  return options;
}

// A count whose 0 means "auto", as its flag spells it.
std::string AutoOr(int64_t n) { return n == 0 ? "auto" : absl::StrCat(n); }

}  // namespace

// The model and the memory budget: every command that runs the engine.
ABSL_FLAG(std::string, model, "", "Model directory (config.json and safetensors shards).");
ABSL_FLAG(
    std::string, preset, "",
    "k3 synth: the model shape (tiny, demo, bench, slice or full; default tiny). Elsewhere: the "
    "memory preset (ultra, laptop, desktop, workstation, server, max, auto; default auto).");
ABSL_FLAG(double, ram_gb, EngineDefaults().memory.ram_gb,
          "RAM budget in GB for the whole engine (trunk, expert cache, state, buffers); output "
          "is the same at any budget, only speed changes.");
ABSL_FLAG(double, trunk_gb, EngineDefaults().memory.trunk_gb,
          "Explicit split: GB of pinned trunk (with --cache-gb).");
ABSL_FLAG(double, cache_gb, EngineDefaults().memory.cache_gb,
          "Explicit split: GB of expert cache (with --trunk-gb).");
ABSL_FLAG(std::string, trunk, EngineDefaults().trunk_dir,
          "Directory of a packed trunk (`k3 pack`) to stream from.");
ABSL_FLAG(std::string, max_context, AutoOr(EngineDefaults().max_context),
          "Tokens of context a sequence, N or auto: the most whose state for every sequence "
          "planned takes a quarter of the budget, up to the model's limit (1M for Kimi K3); the "
          "plan says which, and warns below 32768.");
ABSL_FLAG(std::string, settings, "",
          "A settings file (`k3 tune --out`): its flags apply unless given on the command line.");

// How the engine reads and computes: speed only, never the tokens.
ABSL_FLAG(std::vector<std::string>, queue_depth, {},
          "io_uring queue depth: reads kept in flight (a list where a command sweeps it).");
ABSL_FLAG(std::vector<std::string>, storage_profile, {},
          "direct (the real device, O_DIRECT), an emulated volume (nvme, network, sata) or "
          "lat=2ms,bw=500MB/s,iops=5000,qd=32 (any subset; a list where a command sweeps it).");
ABSL_FLAG(std::vector<std::string>, volume, {},
          "A directory holding copies of the model's files (shards, k3 pack output; any subset, "
          "same names) or a k3 stripe layout, on another drive: each read is split over every "
          "drive holding its bytes, by their measured rates. Repeat it for several drives. "
          "DIR@PROFILE gives the directory an emulated storage profile (and makes it a drive of "
          "its own); --storage-profile is that of --model's directory and of volumes without "
          "one. Copies are checked when opened (size, header, samples).");
ABSL_FLAG(bool, sweep_volumes, false,
          "k3 bench: rows read from the model's directory alone, then with the first --volume, "
          "the first two, ... (without it every row reads from every --volume).");
ABSL_FLAG(bool, verify_volumes, false,
          "Compare every byte of each --volume copy (and every stripe's checksums) with the "
          "model's files.");
ABSL_FLAG(std::vector<std::string>, prefetch_distance, {},
          "Layers of lookahead: routers of layers l+1..l+D run on layer l's hidden state and "
          "their experts are prefetched (0 = off: see docs/PERFORMANCE.md; a list where a "
          "command sweeps it).");
ABSL_FLAG(int32_t, prefetch_width, EngineDefaults().prefetch_width,
          "Experts predicted per lookahead layer (0 = the top-k).");
ABSL_FLAG(int32_t, prefill_prefetch_distance, EngineDefaults().prefill_prefetch_distance,
          "Layers of lookahead while the prompt is processed (prefill multiplies many tokens per "
          "expert, so the next layer's reads hide behind that compute; 0 = off).");
ABSL_FLAG(int32_t, threads, EngineDefaults().threads, "Compute threads (0 = one per core).");
ABSL_FLAG(std::string, prompt_cache, "",
          "Directory that keeps prompt states across runs: a prompt that extends a cached one "
          "runs only the tokens after it (docs/PROMPT-CACHE.md). Default: none for generate and "
          "chat; serve keeps one in $XDG_CACHE_HOME/k3/prompt-cache (or ~/.cache/k3/...); "
          "none: off.");
ABSL_FLAG(double, prompt_cache_gb, 20,
          "The most GB --prompt-cache keeps on disk; the least recently used states go first.");
ABSL_FLAG(std::string, prefill_chunk, AutoOr(EngineDefaults().prefill_chunk),
          "Prompt tokens run through each layer together, N or auto: the most whose activations "
          "take a quarter of the budget (at most --max-context); the plan says which. A chunk "
          "reads the streamed trunk and each expert it touches once. With --trunk-gb/--cache-gb "
          "the split stays as given and auto's activations come on top of it, a quarter of the "
          "total (what --ram-gb of that total gets; within the RAM available); --preset ultra "
          "keeps 64.");
ABSL_FLAG(double, ring_piece_mb, static_cast<double>(EngineDefaults().ring_piece_bytes) / (1 << 20),
          absl::StrCat("Trunk ring: MB of a piece, the most of one matrix's rows read and "
                       "multiplied at once where the trunk streams (0 = ",
                       k3::kDefaultPieceBytes >> 20, " MiB, or less for smaller matrices)."));
ABSL_FLAG(int32_t, ring_slots, EngineDefaults().ring_slots,
          absl::StrCat("Trunk ring: pieces in memory at once, >= 2 (0 = ", k3::kDefaultRingSlots,
                       ")."));
ABSL_FLAG(std::string, cache_policy, EngineDefaults().cache_policy,
          absl::StrCat("Expert cache replacement policy (empty: ", std::string(k3::kDefaultPolicy),
                       "; see k3 cache-sim --help)."));
ABSL_FLAG(bool, no_overlap, !EngineDefaults().overlap,
          "Serial baseline: read all of a layer's experts, then compute; no lookahead. Same "
          "output, for A/B measurements.");

// The prompt and the sampler.
ABSL_FLAG(std::string, prompt, "", "Prompt text (encoded with the model's tokenizer).");
ABSL_FLAG(std::string, prompt_file, "", "Read the prompt text from this file.");
ABSL_FLAG(std::string, ids, "", "Prompt as raw token ids, e.g. 3,7,11 (no tokenizer needed).");
ABSL_FLAG(int32_t, n_predict, 32, "Tokens to generate (stops earlier at a stop id).");
ABSL_FLAG(bool, greedy, false, "Always take the most likely token (the default without --temp).");
ABSL_FLAG(double, temp, 0.0, "Sampling temperature; 0 means greedy.");
ABSL_FLAG(int32_t, top_k, 40, "Sample among the k most likely tokens (0 = all).");
ABSL_FLAG(double, top_p, 0.95, "Nucleus sampling: the smallest set with this much probability.");
ABSL_FLAG(uint64_t, seed, 0, "Random seed; the same seed gives the same bytes.");
ABSL_FLAG(std::vector<std::string>, stop_id, {},
          "Token id that ends generation (repeatable; default: [EOS] and <|end_of_msg|>).");
ABSL_FLAG(bool, ignore_eos, false, "Generate all --n-predict tokens: no stop ids at all.");
ABSL_FLAG(std::string, tokenizer, "",
          "Directory with tiktoken.model and tokenizer_config.json (default: the model's).");
ABSL_FLAG(std::string, dump_logits, "",
          "Write the logits at the last prompt position (raw little-endian float32, vocab_size "
          "values).");
ABSL_FLAG(std::string, system, "", "System prompt: the first message of the conversation.");
ABSL_FLAG(std::string, tools, "",
          "chat: a JSON file of OpenAI tool definitions the model may call (docs/TOOLS.md).");
ABSL_FLAG(int32_t, reasoning_budget, -1,
          "chat, serve: the most tokens the think channel may take; then it is closed and the "
          "response opened (-1: no limit; a request's reasoning_budget overrides it).");
ABSL_FLAG(std::string, tool_choice, "auto",
          "chat with --tools: auto, required, none, or the name of the tool every reply calls.");
ABSL_FLAG(std::string, history, "",
          "Save the conversation to this JSON file after every turn; resume it when the file "
          "exists.");

// Batches (generate --prompts) and the server.
ABSL_FLAG(std::string, prompts, "",
          "k3 generate: a JSON-lines file of prompts, one object per line with \"prompt\" (text) "
          "or \"ids\", and optional \"id\", \"n_predict\", \"temperature\", \"top_k\", \"top_p\", "
          "\"seed\", \"greedy\", \"stop_ids\"; they run batched, results as JSON lines in input "
          "order.");
ABSL_FLAG(int32_t, batch, 0,
          "Sequences run at once, for k3 generate --prompts and k3 serve (0 = what the budget "
          "holds, at most 8).");
ABSL_FLAG(std::string, bad_lines, "refuse",
          "k3 generate --prompts: a malformed line is reported and either refuses the run "
          "before anything is generated (refuse) or is left out (skip).");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "the address to listen on (loopback by default; 0.0.0.0 for every one).");
ABSL_FLAG(int32_t, port, 8080, "the TCP port (0: any free one, printed at start).");
ABSL_FLAG(std::string, api_key, "",
          "require 'Authorization: Bearer KEY' (default: $K3_API_KEY, else none).");
ABSL_FLAG(int32_t, max_queue, 16, "requests that may wait for a place in the batch; more get 429.");
ABSL_FLAG(int32_t, saved_states, -1,
          "sequence states kept for prefix reuse (-1: up to 4, as the budget holds).");
ABSL_FLAG(double, max_body_mb, 8, "larger request bodies get 413.");
ABSL_FLAG(std::string, model_id, "",
          "the model name /v1/models lists and answers carry (default: the model "
          "directory's name).");
ABSL_FLAG(double, drain_seconds, 30,
          "on SIGTERM, stop taking requests (503) and let those in flight finish for up to "
          "this many seconds before ending them (0: end them at once).");

// What the commands write.
ABSL_FLAG(std::string, out, "",
          "Where the command writes its output: the directory of the model (synth) or pack "
          "(pack), the directories of the stripes, comma-separated (stripe), the results as JSON "
          "lines (generate --prompts; default stdout), the settings file (tune, for --settings).");
ABSL_FLAG(std::string, report_json, "",
          "Write the figures of the run as JSON to this file (generate, chat: ids, timings, "
          "memory; bench, cache-sim, doctor: the results). Also spelled --out-json.");
ABSL_FLAG(std::string, out_csv, "", "Also write the results as CSV to this file.");
ABSL_FLAG(std::string, plot, "",
          "Write an SVG plot: s/token against queue depth, a line per prefetch distance, a panel "
          "per volume (model directory x storage profile).");
ABSL_FLAG(bool, quiet, false, "No progress bars or per-step tables.");

// Benchmarks, tuning and the cache simulator.
ABSL_FLAG(int32_t, tokens, 24,
          "Greedy decode steps per run of the decode benchmark (at least 2); s/token is their "
          "median.");
ABSL_FLAG(int32_t, repeat, 3, "Repetitions of each measurement; medians are reported.");
ABSL_FLAG(bool, raw, false,
          "Measure only the io layer's read bandwidth: random whole experts, O_DIRECT, at each "
          "queue depth.");
ABSL_FLAG(
    int32_t, reads, 96,
    "Experts read per raw bandwidth measurement (bench --raw, the decode benchmark's raw column "
    "and tune's per-drive sweep): each a different expert, chosen at random.");
ABSL_FLAG(int32_t, chunk_kib, 0,
          "Split reads into chunks of this many KiB (--raw; 0: the engine's default).");
ABSL_FLAG(bool, huge_pages, true,
          "Back the read buffers with huge pages where available (--nohuge-pages: 4 KiB pages, "
          "like fio's buffers).");
ABSL_FLAG(bool, fio, true,
          "With --raw and the direct profile, also run fio (if installed) on the same files, "
          "block size and queue depth, interleaved with k3's runs (--nofio to skip).");
ABSL_FLAG(double, disk_gbps, 0,
          "Disk read rate in GB/s for the forecasts (0 = measure it as k3 doctor does).");
ABSL_FLAG(double, budget_s, 600,
          "k3 tune: seconds the sweep may take, confirmation included (it skips what does not "
          "fit, and says so).");
ABSL_FLAG(std::vector<std::string>, prefetch_widths, {},
          "k3 tune: prefetch widths to try when lookahead is on (0 = the top-k; default 0 and "
          "twice the top-k).");
ABSL_FLAG(std::vector<std::string>, thread_counts, {},
          "k3 tune: compute thread counts to try (0 = one per core; default 0, 1 and half the "
          "cores).");
ABSL_FLAG(std::string, trace, "",
          "Expert trace to replay: little-endian int32 pairs (layer, expert), in request order.");
ABSL_FLAG(std::vector<std::string>, capacity_gb, std::vector<std::string>({"8", "16", "32", "64"}),
          "Cache capacities in GB (1e9 bytes), comma-separated; each holds floor(capacity / "
          "expert bytes) experts.");
ABSL_FLAG(std::vector<std::string>, policy,
          std::vector<std::string>({"lru", "belady", std::string(k3::kDefaultPolicy)}),
          "Replacement policies, comma-separated: 'all', 'default' or names from "
          "lru, belady, fifo, mru, lfu, wtinylfu, arc, 2q, s3fifo, lirs, layer-mru, layer-lfu, "
          "layer-freq, layer-reuse.");
ABSL_FLAG(int64_t, expert_bytes, static_cast<int64_t>(k3::kKimiK3ExpertBytes),
          "Bytes of one expert (Kimi K3: 17547264).");

// Making and packing checkpoints.
ABSL_FLAG(std::vector<std::string>, set, {},
          "Override a config key, e.g. --set hidden_size=256 --set full_attn_layers=4,8 "
          "(repeatable; a list value keeps its commas).");
ABSL_FLAG(double, router_skew, 0.0,
          "Per-expert popularity in the router bias (0 = uniform routing; about 1 looks like "
          "real traces).");
ABSL_FLAG(std::string, dtype, "release",
          "Float tensors: release (BF16 matrices, F32 where the release has F32), f16 or f32.");
ABSL_FLAG(std::string, weights, "",
          "k3 synth: how weight matrices are drawn: gaussian (the exponent distribution of "
          "trained weights) or uniform; default gaussian for slice and full, uniform otherwise. "
          "k3 stripe: each --out directory's share of the experts, comma-separated (2,1,0.2); "
          "default: their measured read rates.");
ABSL_FLAG(bool, sparse, false,
          "k3 synth: headers only, the tensor data left as file holes that read as zeros.");
ABSL_FLAG(bool, single_file, false,
          "k3 synth: the language model in one model.safetensors, without an index.");
ABSL_FLAG(bool, force, false,
          "Overwrite an existing model, pack or stripes in the output directory.");
ABSL_FLAG(std::string, codec, "",
          "Store the BF16 matrices compressed with this exact codec (bf16-e3); the decoded bytes "
          "are the checkpoint's. Default: every tensor verbatim.");
ABSL_FLAG(bool, verify_only, false,
          "Write nothing: re-read the pack in --out and compare it byte for byte with --model "
          "(pack); check every extent of the stripes in --out against its CRC-32C (stripe).");
ABSL_FLAG(bool, measure, false,
          "k3 stripe: weight each --out directory by its read rate, measured on a scratch file "
          "written there and deleted (what happens without --weights).");
ABSL_FLAG(int32_t, copies, 1,
          "k3 stripe: write each routed expert to this many distinct --out directories (1 to "
          "their count), so that a layer's reads can be balanced over the drives (layout "
          "experts).");
ABSL_FLAG(std::string, layout, "",
          "k3 stripe: slices (each expert cut into one piece per --out directory, sized by its "
          "weight: every read keeps every drive busy) or experts (whole experts dealt over the "
          "directories; with --copies). Default: slices, or experts with --copies > 1.");

namespace k3::cli {
namespace {

template <typename T>
const absl::CommandLineFlag* F(const absl::Flag<T>& flag) {
  return &absl::GetFlagReflectionHandle(flag);
}

// Every command that runs the engine takes its memory, I/O and compute flags (k3 tune sweeps
// threads and the prefetch width with flags of its own, and writes settings rather than
// reading them).
constexpr Commands kRunsEngine = kGenerate | kChat | kServe | kBench | kTune;
constexpr Commands kSamples = kGenerate | kChat;

}  // namespace

const std::vector<FlagUse>& FlagTable() {
  static const std::vector<FlagUse> kTable = {
      {F(FLAGS_model), kRunsEngine | kInspect | kDoctor | kPack | kStripe},
      {F(FLAGS_preset), kRunsEngine | kSynth},
      {F(FLAGS_ram_gb), kRunsEngine},
      {F(FLAGS_trunk_gb), kRunsEngine},
      {F(FLAGS_cache_gb), kRunsEngine},
      {F(FLAGS_trunk), kRunsEngine},
      {F(FLAGS_max_context), kRunsEngine},
      {F(FLAGS_settings), kRunsEngine & ~kTune},
      {F(FLAGS_queue_depth), kRunsEngine},
      {F(FLAGS_storage_profile), kRunsEngine},
      {F(FLAGS_volume), kRunsEngine | kInspect | kDoctor},
      {F(FLAGS_sweep_volumes), kBench},
      {F(FLAGS_verify_volumes), kInspect},
      {F(FLAGS_prefetch_distance), kRunsEngine},
      {F(FLAGS_prefetch_width), kRunsEngine & ~kTune},
      {F(FLAGS_prefill_prefetch_distance), kRunsEngine},
      {F(FLAGS_threads), kRunsEngine & ~kTune},
      {F(FLAGS_prefill_chunk), kRunsEngine},
      {F(FLAGS_prompt_cache), kSamples | kServe},
      {F(FLAGS_prompt_cache_gb), kSamples | kServe},
      {F(FLAGS_ring_piece_mb), kRunsEngine},
      {F(FLAGS_ring_slots), kRunsEngine},
      {F(FLAGS_cache_policy), kRunsEngine},
      {F(FLAGS_no_overlap), kRunsEngine},
      {F(FLAGS_prompt), kGenerate},
      {F(FLAGS_prompt_file), kGenerate},
      {F(FLAGS_ids), kGenerate},
      {F(FLAGS_n_predict), kSamples | kServe},
      {F(FLAGS_greedy), kSamples},
      {F(FLAGS_temp), kSamples},
      {F(FLAGS_top_k), kSamples},
      {F(FLAGS_top_p), kSamples},
      {F(FLAGS_seed), kSamples | kBench | kTune | kSynth},
      {F(FLAGS_stop_id), kGenerate},
      {F(FLAGS_ignore_eos), kGenerate},
      {F(FLAGS_tokenizer), kSamples | kServe},
      {F(FLAGS_dump_logits), kGenerate},
      {F(FLAGS_system), kChat},
      {F(FLAGS_tools), kChat},
      {F(FLAGS_tool_choice), kChat},
      {F(FLAGS_reasoning_budget), kChat | kServe},
      {F(FLAGS_history), kChat},
      {F(FLAGS_prompts), kGenerate},
      {F(FLAGS_batch), kGenerate | kServe},
      {F(FLAGS_bad_lines), kGenerate},
      {F(FLAGS_host), kServe},
      {F(FLAGS_port), kServe},
      {F(FLAGS_api_key), kServe},
      {F(FLAGS_max_queue), kServe},
      {F(FLAGS_saved_states), kServe},
      {F(FLAGS_max_body_mb), kServe},
      {F(FLAGS_model_id), kServe},
      {F(FLAGS_drain_seconds), kServe},
      {F(FLAGS_out), kSynth | kPack | kStripe | kGenerate | kTune},
      {F(FLAGS_report_json), kSamples | kBench | kCacheSim | kDoctor},
      {F(FLAGS_out_csv), kBench},
      {F(FLAGS_plot), kBench},
      {F(FLAGS_quiet), kSamples | kServe | kBench | kTune | kCacheSim | kSynth | kPack | kStripe},
      {F(FLAGS_tokens), kBench | kTune},
      {F(FLAGS_repeat), kBench | kTune},
      {F(FLAGS_raw), kBench},
      {F(FLAGS_reads), kBench | kTune},
      {F(FLAGS_chunk_kib), kBench},
      {F(FLAGS_huge_pages), kBench},
      {F(FLAGS_fio), kBench},
      {F(FLAGS_disk_gbps), kInspect},
      {F(FLAGS_budget_s), kTune},
      {F(FLAGS_prefetch_widths), kTune},
      {F(FLAGS_thread_counts), kTune},
      {F(FLAGS_trace), kCacheSim},
      {F(FLAGS_capacity_gb), kCacheSim},
      {F(FLAGS_policy), kCacheSim},
      {F(FLAGS_expert_bytes), kCacheSim},
      {F(FLAGS_set), kSynth},
      {F(FLAGS_router_skew), kSynth},
      {F(FLAGS_dtype), kSynth},
      {F(FLAGS_weights), kSynth | kStripe},
      {F(FLAGS_sparse), kSynth},
      {F(FLAGS_single_file), kSynth},
      {F(FLAGS_force), kSynth | kPack | kStripe},
      {F(FLAGS_codec), kPack},
      {F(FLAGS_verify_only), kPack | kStripe},
      {F(FLAGS_measure), kStripe},
      {F(FLAGS_copies), kStripe},
      {F(FLAGS_layout), kStripe},
  };
  return kTable;
}

std::string TypedName(const absl::CommandLineFlag& flag) {
  return absl::StrReplaceAll(flag.Name(), {{"_", "-"}});
}

std::string_view CanonicalFlagName(std::string_view typed) {
  return typed == "out-json" ? "report-json" : typed;
}

const FlagUse* FindFlag(std::string_view typed) {
  const std::string_view name = CanonicalFlagName(typed);
  const std::vector<FlagUse>& table = FlagTable();
  auto row = std::find_if(table.begin(), table.end(),
                          [&](const FlagUse& use) { return TypedName(*use.flag) == name; });
  return row == table.end() ? nullptr : &*row;
}

}  // namespace k3::cli
