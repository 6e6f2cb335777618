// Micro-benchmarks of the read engine's own cost: submit-to-completion overhead per request at
// small sizes on a cached file (buffered reads, so the page cache answers and the engine's path
// is what is measured), against a bare pread() as the floor. Disk bandwidth is measured by
// `k3 bench --raw`, not here.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "io/aligned_buffer.h"
#include "io/file.h"
#include "io/read_engine.h"

namespace k3::io {
namespace {

constexpr size_t kFileBytes = 64 << 20;

// A 64 MB file in a fresh temporary directory, removed at exit.
class CachedFile {
 public:
  CachedFile() {
    std::string templ = (std::filesystem::temp_directory_path() / "k3-io-bench-XXXXXX").string();
    dir_ = ::mkdtemp(templ.data());
    path_ = dir_ + "/data.bin";
    std::string bytes(kFileBytes, '\0');
    for (size_t i = 0; i < bytes.size(); i += 4096) bytes[i] = static_cast<char>(i >> 12);
    if (!WriteFileAtomically(path_, bytes).ok()) std::abort();
  }
  ~CachedFile() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

const CachedFile& File() {
  static const CachedFile* file = new CachedFile();
  return *file;
}

struct Setup {
  std::unique_ptr<BufferArena> arena;
  std::unique_ptr<ReadEngine> engine;
  FileId file = -1;
};

Setup MakeSetup(Backend backend, int depth, size_t arena_bytes) {
  Setup s;
  s.arena = *BufferArena::Create(arena_bytes);
  ReadEngineOptions o;
  o.backend = backend;
  o.queue_depth = depth;
  o.direct = false;  // the page cache answers: what is left is the engine's overhead
  o.arena = s.arena.get();
  o.notices = false;
  s.engine = *ReadEngine::Create(o);
  s.file = *s.engine->OpenFile(File().path());
  return s;
}

ReadRequest Request(const Setup& s, uint64_t offset, uint64_t bytes, size_t slot) {
  ReadRequest r;
  r.file = s.file;
  r.offset = offset;
  r.length = bytes;
  r.buffer = s.arena->Slice(slot * AlignUp(bytes + kDirectAlignment), AlignUp(bytes + 4096));
  r.user_data = slot;
  return r;
}

// One request at a time: Submit + Wait, the latency the engine adds to a cache-hot read.
void BM_SubmitWait(benchmark::State& state, Backend backend) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  Setup s = MakeSetup(backend, 1, 4 << 20);
  uint64_t offset = 0;
  for (auto _ : state) {
    auto data = s.engine->Read(Request(s, offset, bytes, 0));
    if (!data.ok()) state.SkipWithError("read failed");
    offset = (offset + 4096 * 7) % (kFileBytes - bytes);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.SetItemsProcessed(state.iterations());
}

// A batch of 32 submitted together, consumed with WaitAny: the throughput of the
// submission/completion path when the queue is kept full.
void BM_Batch32(benchmark::State& state, Backend backend) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  constexpr int kBatch = 32;
  Setup s = MakeSetup(backend, kBatch, kBatch * AlignUp(bytes + kDirectAlignment) + (4 << 20));
  uint64_t offset = 0;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) {
      if (!s.engine->Submit(Request(s, offset, bytes, i)).ok()) state.SkipWithError("submit");
      offset = (offset + 4096 * 7) % (kFileBytes - bytes);
    }
    for (int i = 0; i < kBatch; ++i) {
      auto r = s.engine->WaitAny();
      if (!r || !r->status.ok()) state.SkipWithError("read failed");
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBatch * bytes));
  state.SetItemsProcessed(state.iterations() * kBatch);
}

// The floor: a bare pread() of the same sizes from the same cached file.
void BM_PreadBaseline(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  const int fd = ::open(File().path().c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<uint8_t> buf(bytes);
  uint64_t offset = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(::pread(fd, buf.data(), bytes, static_cast<off_t>(offset)));
    offset = (offset + 4096 * 7) % (kFileBytes - bytes);
  }
  ::close(fd);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK_CAPTURE(BM_SubmitWait, uring, Backend::kUring)->Arg(4096)->Arg(65536)->UseRealTime();
BENCHMARK_CAPTURE(BM_SubmitWait, pread, Backend::kPread)->Arg(4096)->Arg(65536)->UseRealTime();
BENCHMARK_CAPTURE(BM_Batch32, uring, Backend::kUring)->Arg(4096)->Arg(65536)->UseRealTime();
BENCHMARK_CAPTURE(BM_Batch32, pread, Backend::kPread)->Arg(4096)->Arg(65536)->UseRealTime();
BENCHMARK(BM_PreadBaseline)->Arg(4096)->Arg(65536);

}  // namespace
}  // namespace k3::io

BENCHMARK_MAIN();
