// Helpers for the io tests: files of known random bytes, buffers, engines per backend.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "io/aligned_buffer.h"
#include "io/file.h"
#include "io/read_engine.h"

namespace k3::io::testing {

struct TestFile {
  std::string path;
  std::vector<uint8_t> bytes;
};

// A file of `size` pseudo-random bytes (different per seed), written through io/file.h.
inline TestFile MakeFile(const std::string& path, size_t size, uint64_t seed = 1) {
  TestFile f{path, std::vector<uint8_t>(size)};
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < size; ++j)
      f.bytes[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  absl::Status s = WriteFileAtomically(
      path, std::string_view(reinterpret_cast<const char*>(f.bytes.data()), f.bytes.size()));
  EXPECT_TRUE(s.ok()) << s;
  return f;
}

inline std::unique_ptr<BufferArena> MakeArena(size_t bytes) {
  auto arena = BufferArena::Create(bytes);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return arena.ok() ? *std::move(arena) : nullptr;
}

inline ReadRequest MakeRequest(FileId file, uint64_t offset, uint64_t length,
                               std::span<uint8_t> buffer, Priority priority = Priority::kDemand,
                               uint64_t user_data = 0) {
  ReadRequest r;
  r.file = file;
  r.offset = offset;
  r.length = length;
  r.buffer = buffer;
  r.priority = priority;
  r.user_data = user_data;
  return r;
}

// True when `data` equals the file's bytes at [offset, offset + data.size()).
inline bool SameBytes(const TestFile& f, uint64_t offset, std::span<const uint8_t> data) {
  if (offset + data.size() > f.bytes.size()) return false;
  return std::equal(data.begin(), data.end(), f.bytes.begin() + static_cast<ptrdiff_t>(offset));
}

inline ReadEngineOptions OptionsFor(Backend backend) {
  ReadEngineOptions o;
  o.backend = backend;
  o.notices = false;
  return o;
}

inline std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kUring ? "Uring" : "Pread";
}

// Creates an engine or skips the test when io_uring is not available on this machine.
#define K3_CREATE_ENGINE_OR_SKIP(var, options)                            \
  auto var##_or = ::k3::io::ReadEngine::Create(options);                  \
  if (!var##_or.ok() && (options).backend == ::k3::io::Backend::kUring) { \
    GTEST_SKIP() << "io_uring unavailable: " << var##_or.status();        \
  }                                                                       \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                        \
  std::unique_ptr<::k3::io::ReadEngine> var = *std::move(var##_or)

}  // namespace k3::io::testing
