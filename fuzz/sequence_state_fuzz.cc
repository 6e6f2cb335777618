// SequenceState::Load on damaged or foreign state files. The model is small (one KDA layer,
// one MLA layer) so that a seed state fits in a few kilobytes. Load must refuse what does not
// match with a status, never over-read or allocate what the file merely claims; a state it
// accepts must save back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/model/sequence_state.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/small_model.h"
#include "io/file.h"

// K3_FUZZ_WRITE_SEED=FILE writes a valid state of two tokens (the seed in corpus/) and exits:
// the file holds the config fingerprint, which only this code computes.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* seed = std::getenv("K3_FUZZ_WRITE_SEED");
  if (seed == nullptr) return 0;
  const int32_t tokens[] = {3, 5};
  const k3::SequenceState state = k3::fuzzing::SmallState(tokens);
  std::exit(state.Save(seed).ok() ? 0 : 1);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const k3::ModelConfig& model = k3::fuzzing::SmallModel();
  const k3::fuzzing::ScratchDir& dir = k3::fuzzing::Scratch();
  const std::string in(reinterpret_cast<const char*>(data), size);
  const std::string path = dir.Write("state.bin", in);
  auto state = k3::SequenceState::Load(path, model);
  if (!state.ok()) return 0;
  const std::string again = (dir.path() / "again.bin").string();
  if (!state->Save(again).ok()) std::abort();
  auto saved = k3::io::ReadFileToString(again);
  if (!saved.ok() || *saved != in) std::abort();
  return 0;
}
