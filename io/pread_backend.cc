// The fallback backend for machines where io_uring cannot be set up (seccomp profiles of
// container runtimes, kernel.io_uring_disabled): a pool of threads, each doing one blocking
// pread() per chunk. Same scheduler, same chunking and retries; only the issuing differs.
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "io/engine_internal.h"

namespace k3::io::internal {
namespace {

class PreadBackend : public Backend {
 public:
  explicit PreadBackend(int threads) : threads_(threads) {}
  ~PreadBackend() override { Join(); }

  std::string_view name() const override { return "pread"; }
  size_t capacity() const override { return static_cast<size_t>(threads_); }
  void Start(ChunkSource* source) override {
    for (int i = 0; i < threads_; ++i) workers_.emplace_back([source] { Work(source); });
  }
  // Workers wait on the scheduler's own lock conditions, which wake them.
  void Wake() override {}
  void Join() override {
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  static void Work(ChunkSource* source) {
    while (Chunk* c = source->WaitForChunk()) {
      const ssize_t n = ::pread(c->fd, c->dest, c->length, static_cast<off_t>(c->file_offset));
      source->Complete(c, n < 0 ? -static_cast<int64_t>(errno) : n);
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<Backend> CreatePreadBackend(int threads) {
  return std::make_unique<PreadBackend>(threads);
}

}  // namespace k3::io::internal
