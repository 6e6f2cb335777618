// Every flag of the `k3` command, defined once (apps/options/flags.cc), and the one table that says
// which commands take each: the parser refuses a flag its command does not take and --help lists
// exactly the command's flags, in the table's order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/declare.h"

// The model and the memory budget: every command that runs the engine.
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, preset);
ABSL_DECLARE_FLAG(double, ram_gb);
ABSL_DECLARE_FLAG(double, trunk_gb);
ABSL_DECLARE_FLAG(double, cache_gb);
ABSL_DECLARE_FLAG(std::string, trunk);
ABSL_DECLARE_FLAG(std::string, max_context);
ABSL_DECLARE_FLAG(std::string, settings);
// How the engine reads and computes: speed only, never the tokens.
ABSL_DECLARE_FLAG(std::vector<std::string>, queue_depth);
ABSL_DECLARE_FLAG(std::vector<std::string>, storage_profile);
ABSL_DECLARE_FLAG(std::vector<std::string>, volume);
ABSL_DECLARE_FLAG(bool, sweep_volumes);
ABSL_DECLARE_FLAG(bool, verify_volumes);
ABSL_DECLARE_FLAG(std::vector<std::string>, prefetch_distance);
ABSL_DECLARE_FLAG(int32_t, prefetch_width);
ABSL_DECLARE_FLAG(int32_t, prefill_prefetch_distance);
ABSL_DECLARE_FLAG(int32_t, threads);
ABSL_DECLARE_FLAG(std::string, prefill_chunk);
ABSL_DECLARE_FLAG(std::string, prompt_cache);
ABSL_DECLARE_FLAG(double, prompt_cache_gb);
ABSL_DECLARE_FLAG(double, ring_piece_mb);
ABSL_DECLARE_FLAG(int32_t, ring_slots);
ABSL_DECLARE_FLAG(std::string, cache_policy);
ABSL_DECLARE_FLAG(bool, no_overlap);
// The prompt and the sampler.
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, prompt_file);
ABSL_DECLARE_FLAG(std::string, ids);
ABSL_DECLARE_FLAG(int32_t, n_predict);
ABSL_DECLARE_FLAG(bool, greedy);
ABSL_DECLARE_FLAG(double, temp);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop_id);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(std::string, tokenizer);
ABSL_DECLARE_FLAG(std::string, dump_logits);
ABSL_DECLARE_FLAG(std::string, system);
ABSL_DECLARE_FLAG(std::string, tools);
ABSL_DECLARE_FLAG(std::string, tool_choice);
ABSL_DECLARE_FLAG(int32_t, reasoning_budget);
ABSL_DECLARE_FLAG(std::string, history);
// Batches (generate --prompts) and the server.
ABSL_DECLARE_FLAG(std::string, prompts);
ABSL_DECLARE_FLAG(int32_t, batch);
ABSL_DECLARE_FLAG(std::string, bad_lines);
ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(int32_t, port);
ABSL_DECLARE_FLAG(std::string, api_key);
ABSL_DECLARE_FLAG(int32_t, max_queue);
ABSL_DECLARE_FLAG(int32_t, saved_states);
ABSL_DECLARE_FLAG(double, max_body_mb);
ABSL_DECLARE_FLAG(std::string, model_id);
ABSL_DECLARE_FLAG(double, drain_seconds);
// What the commands write.
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, report_json);
ABSL_DECLARE_FLAG(std::string, out_csv);
ABSL_DECLARE_FLAG(std::string, plot);
ABSL_DECLARE_FLAG(bool, quiet);
// Benchmarks, tuning and the cache simulator.
ABSL_DECLARE_FLAG(int32_t, tokens);
ABSL_DECLARE_FLAG(int32_t, repeat);
ABSL_DECLARE_FLAG(bool, raw);
ABSL_DECLARE_FLAG(int32_t, reads);
ABSL_DECLARE_FLAG(int32_t, chunk_kib);
ABSL_DECLARE_FLAG(bool, huge_pages);
ABSL_DECLARE_FLAG(bool, fio);
ABSL_DECLARE_FLAG(double, disk_gbps);
ABSL_DECLARE_FLAG(double, budget_s);
ABSL_DECLARE_FLAG(std::vector<std::string>, prefetch_widths);
ABSL_DECLARE_FLAG(std::vector<std::string>, thread_counts);
ABSL_DECLARE_FLAG(std::string, trace);
ABSL_DECLARE_FLAG(std::vector<std::string>, capacity_gb);
ABSL_DECLARE_FLAG(std::vector<std::string>, policy);
ABSL_DECLARE_FLAG(int64_t, expert_bytes);
// Making and packing checkpoints.
ABSL_DECLARE_FLAG(std::vector<std::string>, set);
ABSL_DECLARE_FLAG(double, router_skew);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, weights);
ABSL_DECLARE_FLAG(bool, sparse);
ABSL_DECLARE_FLAG(bool, single_file);
ABSL_DECLARE_FLAG(bool, force);
ABSL_DECLARE_FLAG(std::string, codec);
ABSL_DECLARE_FLAG(bool, verify_only);
ABSL_DECLARE_FLAG(bool, measure);
ABSL_DECLARE_FLAG(int32_t, copies);
ABSL_DECLARE_FLAG(std::string, layout);

namespace k3::cli {

// The commands of `k3`, as bits, so that a flag's row names every command that takes it.
enum Command : uint32_t {
  kSynth = 1u << 0,
  kInspect = 1u << 1,
  kGenerate = 1u << 2,
  kCacheSim = 1u << 3,
  kBench = 1u << 4,
  kPack = 1u << 5,
  kChat = 1u << 6,
  kDoctor = 1u << 7,
  kServe = 1u << 8,
  kTune = 1u << 9,
  kStripe = 1u << 10,
};
using Commands = uint32_t;

// A row of the table: a flag and the commands that take it.
struct FlagUse {
  const absl::CommandLineFlag* flag;
  Commands commands;
};

// Every flag of k3, in the order --help lists them.
const std::vector<FlagUse>& FlagTable();

// The row of a flag by its name as typed (--n-predict: "n-predict"), or nullptr; an alias
// ("out-json") gives the row of the flag it stands for.
const FlagUse* FindFlag(std::string_view typed);

// Other spellings of a flag's name (CLI.md names `--out-json` for bench, cache-sim and doctor
// and `--report-json` for generate: one flag), typed name -> the flag's typed name.
std::string_view CanonicalFlagName(std::string_view typed);

// A flag's name as typed: dashes where Abseil registers underscores.
std::string TypedName(const absl::CommandLineFlag& flag);

}  // namespace k3::cli
