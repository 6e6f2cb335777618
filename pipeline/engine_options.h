// What a run of the engine asks for: the model, the memory budget and every engine setting, as
// typed values. The flags (and settings files) are parsed into these once, where they are read
// (apps/engine_flags.cc); whatever opens the engine, or a rank's share of it, takes them as they
// are.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/fault_injection.h"
#include "io/read_engine.h"
#include "io/storage_profile.h"
#include "io/volume.h"
#include "pipeline/memory_plan.h"
#include "pipeline/run_plan.h"

namespace k3 {

struct EngineOptions {
  std::string model_dir;
  std::string trunk_dir;  // a `k3 pack` output; empty: streamed trunk layers read from shards
  MemoryRequest memory;
  // Sizes the planned sequence state; kAutoMaxContext: the longest the budget holds
  // (Engine::max_context() says which).
  int64_t max_context = kAutoMaxContext;
  // Sequences run at once (a batch, and any states kept beside it): state is reserved for
  // each. 0: as many as the budget holds beside the model, from min_sequences up to
  // max_sequences (Engine::sequences() says how many). Fewer than asked are refused with the
  // most the budget holds, naming the request as `sequences_source` (empty: "--batch N").
  int sequences = 1;
  int min_sequences = 1;
  int max_sequences = kMaxSequences;
  std::string sequences_source;
  int queue_depth = io::kDefaultQueueDepth;  // reads in flight
  int prefetch_distance = 0;  // layers of lookahead (0 = off; docs/PERFORMANCE.md for why)
  // The same for prompt chunks (prefill), which multiply many tokens per expert and so are
  // compute-bound: reading the next layer's likely experts during that compute costs no time.
  int prefill_prefetch_distance = 1;
  int prefetch_width = 0;              // experts predicted per layer (0 = the model's top-k)
  double prefetch_cap_fraction = 0.5;  // prefetch bytes in flight, as a fraction of the cache
  int threads = 0;                     // compute threads (0 = one per core)
  bool overlap = true;       // false: the serial baseline (read a layer's experts, then compute)
  std::string cache_policy;  // empty: the default policy
  // The drive the model's directory is on, and every volume without a profile of its own.
  io::StorageProfile storage_profile = {};
  // Directories holding copies of the checkpoint's files, or a striped layout's pieces
  // (io/volume.h): reads spread over every drive they are on.
  std::vector<io::Volume> volumes;
  // Compare every byte of the volumes' copies when opening (k3 inspect --verify-volumes)
  // rather than samples.
  bool verify_volumes = false;
  // Prompt tokens run through each layer together; kAutoPrefillChunk: the largest the budget
  // holds (Engine::prefill_chunk() says which).
  int prefill_chunk = kAutoPrefillChunk;
  // The trunk ring (docs/MEMORY.md): the size of a piece and the number of slots; 0 = the
  // defaults (kDefaultPieceBytes, kDefaultRingSlots).
  uint64_t ring_piece_bytes = 0;
  int ring_slots = 0;
  bool direct_io = true;       // O_DIRECT (false only for tests on file systems that refuse it)
  bool show_progress = false;  // progress bar for the first trunk load
  std::shared_ptr<io::FaultPlan> faults;  // tests: faults injected into every read
};

// What the options ask of the run's plan (PlanRun), with the trunk pack if any: the engine and a
// rank of expert parallelism plan from the same request.
inline RunRequest PlanRequestOf(const EngineOptions& o, const TrunkPack* pack) {
  return {.memory = o.memory,
          .max_context = o.max_context,
          .prefill_chunk = o.prefill_chunk,
          .sequences = o.sequences,
          .min_sequences = o.min_sequences,
          .max_sequences = o.max_sequences,
          .sequences_source = o.sequences_source,
          .ring = {.piece_bytes = o.ring_piece_bytes,
                   .slots = o.ring_slots,
                   .pack = pack,
                   .threads = o.threads}};
}

}  // namespace k3
