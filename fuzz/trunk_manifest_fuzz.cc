// The trunk pack's manifest (trunk.json) on arbitrary text, without a checkpoint: structure
// only. A manifest it accepts must describe runs inside the recorded pack size that do not
// overlap, with every tensor inside its run and findable by name.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/checkpoint/trunk_pack.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto pack = k3::TrunkPack::ParseManifest(text, "pack/trunk.json");
  if (!pack.ok()) return 0;
  int64_t tensors = 0;
  for (const k3::PackedRun& run : (*pack)->runs()) {
    if (run.offset > (*pack)->pack_bytes() || run.length > (*pack)->pack_bytes() - run.offset) {
      std::abort();
    }
    if ((*pack)->layer_run(run.layer) != &run) std::abort();
    for (const k3::PackedTensor& t : run.tensors) {
      if (t.offset < run.offset || t.length > run.length ||
          t.offset - run.offset > run.length - t.length) {
        std::abort();
      }
      if ((*pack)->Find(t.name) != &t) std::abort();
      ++tensors;
    }
  }
  if (tensors != (*pack)->tensor_count()) std::abort();
  return 0;
}
