// Plain file access for everything that is not the streaming read path: small files (configs,
// headers, manifests), positional reads with errors that name file and offset, and a
// sequential writer for large outputs (synthetic checkpoints, packed trunks).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace k3::io {

// Reads a whole (small) file. NotFound when it does not exist.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes a small file atomically: temp file in the same directory, fsync, rename.
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

// The same for a file of `size` bytes of which only `head` is written: the rest is a hole (no
// disk blocks) that reads as zeros.
absl::Status WriteSparseFileAtomically(const std::string& path, std::string_view head,
                                       uint64_t size);

// dir + "/" + name.
std::string JoinPath(const std::string& dir, const std::string& name);
bool FileExists(const std::string& path);
bool IsDirectory(const std::string& path);
absl::Status MakeDirectories(const std::string& path);

// A file opened for positional reads (buffered, through the page cache).
class RandomAccessFile {
 public:
  static absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(const std::string& path);
  ~RandomAccessFile();
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Reads exactly out.size() bytes at offset; a short file is DataLoss naming file and offset.
  absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out) const;
  // The same, bypassing the page cache (O_DIRECT, no copy, nothing evicted) where the file
  // system allows it: reads the aligned extent of the range (aligned_buffer.h) into `buffer`,
  // 4 KiB-aligned and at least BufferBytesFor(offset, length) bytes, and returns where the
  // bytes landed in it. For large one-time reads (the resident trunk at start-up).
  absl::StatusOr<std::span<const uint8_t>> ReadDirect(uint64_t offset, uint64_t length,
                                                      std::span<uint8_t> buffer) const;

 private:
  RandomAccessFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  // The O_DIRECT descriptor, opened on first use; -1 while none, -2 once the file system
  // refused O_DIRECT (reads are then buffered).
  int DirectFd() const;
  std::string path_;
  int fd_;
  uint64_t size_;
  mutable std::atomic<int> direct_fd_ = -1;
};

// Streams a large file to disk: the caller appends bytes; full blocks are written by a
// background thread while the caller produces the next ones, with O_DIRECT when the file
// system allows it (so a 16 GB checkpoint does not evict everything else from the page
// cache). The data goes to `path + ".partial"` and is renamed into place by Commit(), so an
// interrupted or failed write never leaves a file that looks complete.
class SequentialWriter {
 public:
  static constexpr size_t kBlockBytes = 8 << 20;

  static absl::StatusOr<std::unique_ptr<SequentialWriter>> Create(const std::string& path);
  ~SequentialWriter();  // Abandons (deletes) the partial file unless committed.
  SequentialWriter(const SequentialWriter&) = delete;
  SequentialWriter& operator=(const SequentialWriter&) = delete;

  // Hands out writable space for up to `max_bytes` (at most kBlockBytes) at the current end;
  // the caller fills a prefix of it and calls Advance() with the count.
  std::span<uint8_t> Reserve(size_t max_bytes);
  absl::Status Advance(size_t bytes);
  absl::Status Append(std::span<const uint8_t> bytes);
  uint64_t bytes_written() const { return total_; }
  // Flushes, truncates to the exact length, fsyncs and renames into place.
  absl::Status Commit();

 private:
  struct Impl;
  explicit SequentialWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  uint64_t total_ = 0;
};

}  // namespace k3::io
