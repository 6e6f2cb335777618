// The prompt cache on a damaged cache file: the input is the file of the state after the tokens
// {3, 5}, under the name the cache gives it. Opening the cache reads its header, a lookup of
// {3, 5, 7} the whole file; neither may crash, over-read, or allocate what the file merely
// claims. A state the lookup returns must be exactly what the file holds: stored into an empty
// cache, it gives the same bytes.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "fuzz/small_model.h"
#include "io/file.h"
#include "pipeline/prompt_cache.h"

namespace {

constexpr char kFingerprint[] = "0123456789abcdef0123456789abcdef";
constexpr int32_t kTokens[] = {3, 5};

std::unique_ptr<k3::PromptCache> OpenCache(const std::string& dir) {
  auto cache = k3::PromptCache::Open(k3::fuzzing::SmallModel(), kFingerprint, {.dir = dir},
                                     [](std::string_view) {});
  if (!cache.ok()) std::abort();
  return *std::move(cache);
}

}  // namespace

// K3_FUZZ_WRITE_SEED=FILE writes the cache file of a valid state (the seed in corpus/) and
// exits: the file holds the config fingerprint, which only this code computes.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* seed = std::getenv("K3_FUZZ_WRITE_SEED");
  if (seed == nullptr) return 0;
  const std::string dir = (k3::fuzzing::Scratch().path() / "seed").string();
  auto cache = OpenCache(dir);
  cache->Store(k3::fuzzing::SmallState(kTokens));
  std::error_code ec;
  std::filesystem::copy_file(cache->PathFor(kTokens), seed,
                             std::filesystem::copy_options::overwrite_existing, ec);
  std::exit(ec ? 1 : 0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const k3::fuzzing::ScratchDir& scratch = k3::fuzzing::Scratch();
  scratch.Clear();
  const std::string in(reinterpret_cast<const char*>(data), size);
  const std::string dir = (scratch.path() / "cache").string();
  std::string path;
  {
    auto probe = OpenCache(dir);
    path = probe->PathFor(kTokens);
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(in.data(), static_cast<std::streamsize>(in.size()));
  }
  const int32_t request[] = {3, 5, 7};
  auto state = OpenCache(dir)->Lookup(request);
  if (!state.has_value()) return 0;
  auto again = OpenCache((scratch.path() / "again").string());
  again->Store(*state);
  auto stored = k3::io::ReadFileToString(again->PathFor(kTokens));
  if (!stored.ok() || *stored != in) std::abort();
  return 0;
}
