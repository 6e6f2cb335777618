#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "io/aligned_buffer.h"
#include "io/tsan_mutex.h"

namespace k3::io {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

absl::Status ErrnoStatus(int err, const std::string& what) {
  std::string msg = absl::StrCat(what, ": ", ErrnoText(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Writes all of `data` at `offset`, retrying on EINTR and short writes.
absl::Status PwriteAll(int fd, const uint8_t* data, size_t len, uint64_t offset,
                       const std::string& path) {
  while (len > 0) {
    ssize_t n = ::pwrite(fd, data, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("writing ", path, " at offset ", offset));
    }
    data += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;

AlignedBuffer AllocateAligned(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) return nullptr;
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

absl::Status WriteAtomically(const std::string& path, std::string_view contents, uint64_t size) {
  // A name of our own (two writers of one file never share a temp file), then fsync, rename and
  // fsync of the directory, so after a crash the file is the old one or the new one, whole.
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("creating ", tmp));
  absl::Status s =
      PwriteAll(fd, reinterpret_cast<const uint8_t*>(contents.data()), contents.size(), 0, tmp);
  if (s.ok() && size > contents.size() && ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("extending ", tmp, " to ", size, " bytes"));
  }
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoStatus(errno, absl::StrCat("syncing ", tmp));
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("renaming ", tmp, " to ", path));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);  // best effort: some file systems refuse fsync on directories
    ::close(dfd);
  }
  return s;
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  auto file = RandomAccessFile::Open(path);
  if (!file.ok()) return file.status();
  std::string out((*file)->size(), '\0');
  absl::Status s = (*file)->ReadAt(0, {reinterpret_cast<uint8_t*>(out.data()), out.size()});
  if (!s.ok()) return s;
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  return WriteAtomically(path, contents, contents.size());
}

absl::Status WriteSparseFileAtomically(const std::string& path, std::string_view head,
                                       uint64_t size) {
  return WriteAtomically(path, head, size);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status MakeDirectories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("creating directory ", path, ": ", ec.message()));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RandomAccessFile>> RandomAccessFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("opening ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("reading the size of ", path));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a file"));
  }
  return std::unique_ptr<RandomAccessFile>(
      new RandomAccessFile(path, fd, static_cast<uint64_t>(st.st_size)));
}

RandomAccessFile::~RandomAccessFile() {
  ::close(fd_);
  if (const int d = direct_fd_.load(); d >= 0) ::close(d);
}

int RandomAccessFile::DirectFd() const {
  int fd = direct_fd_.load();
  if (fd != -1) return fd;
  int opened = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (opened < 0) opened = -2;  // tmpfs and some FUSE file systems refuse O_DIRECT
  if (!direct_fd_.compare_exchange_strong(fd, opened)) {
    if (opened >= 0) ::close(opened);  // another thread opened it first
    return fd;
  }
  return opened;
}

absl::StatusOr<std::span<const uint8_t>> RandomAccessFile::ReadDirect(
    uint64_t offset, uint64_t length, std::span<uint8_t> buffer) const {
  const AlignedExtent e = ExtentFor(offset, length);
  if (buffer.size() < e.aligned_length ||
      reinterpret_cast<uintptr_t>(buffer.data()) % kDirectAlignment != 0) {
    return absl::InternalError(absl::StrCat("ReadDirect of ", path_, ": a buffer of ",
                                            buffer.size(), " bytes, not 4 KiB-aligned or under ",
                                            e.aligned_length));
  }
  const std::span<uint8_t> wanted = buffer.subspan(e.head, length);
  auto buffered = [&]() -> absl::StatusOr<std::span<const uint8_t>> {
    if (absl::Status s = ReadAt(offset, wanted); !s.ok()) return s;
    return wanted;
  };
  const int fd = DirectFd();
  if (fd < 0) return buffered();
  uint64_t done = 0;
  while (done < e.head + length) {
    ssize_t n = ::pread(fd, buffer.data() + done, e.aligned_length - done,
                        static_cast<off_t>(e.aligned_offset + done));
    if (n < 0 && errno == EINTR) continue;
    // Accepted at open, refused at read (some file systems): read through the page cache.
    if (n < 0 && errno == EINVAL && done == 0) return buffered();
    if (n < 0) {
      return ErrnoStatus(errno,
                         absl::StrCat("reading ", path_, " at offset ", e.aligned_offset + done));
    }
    done += static_cast<uint64_t>(n);
    // A read ends short only at the end of the file (which may end before the aligned extent).
    if (n == 0 || done % kDirectAlignment != 0) break;
  }
  if (done < e.head + length) {
    return absl::DataLossError(absl::StrCat(
        path_, ": unexpected end of file at offset ", e.aligned_offset + done, " (needed ", length,
        " bytes from offset ", offset, ", file size ", size_, ")"));
  }
  return wanted;
}

absl::Status RandomAccessFile::ReadAt(uint64_t offset, std::span<uint8_t> out) const {
  uint8_t* dst = out.data();
  size_t left = out.size();
  uint64_t pos = offset;
  while (left > 0) {
    ssize_t n = ::pread(fd_, dst, left, static_cast<off_t>(pos));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("reading ", path_, " at offset ", pos));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path_, ": unexpected end of file at offset ", pos,
                                              " (needed ", out.size(), " bytes from offset ",
                                              offset, ", file size ", size_, ")"));
    }
    dst += n;
    left -= static_cast<size_t>(n);
    pos += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

struct SequentialWriter::Impl {
  // Two writers keep two blocks in flight (a device streams better with more than one
  // outstanding write) while the caller fills the remaining buffers.
  static constexpr int kBuffers = 5;
  static constexpr int kWriters = 2;

  std::string path;
  std::string partial_path;
  int fd = -1;
  bool direct = false;
  bool committed = false;

  std::vector<AlignedBuffer> buffers;
  int current = 0;           // buffer being filled by the caller
  size_t fill = 0;           // bytes in the current buffer
  uint64_t file_offset = 0;  // where the current buffer starts in the file

  absl::Mutex mu;
  std::deque<int> free_list ABSL_GUARDED_BY(mu);
  std::deque<std::pair<int, uint64_t>> pending ABSL_GUARDED_BY(mu);  // (buffer, offset)
  bool closing ABSL_GUARDED_BY(mu) = false;
  absl::Status error ABSL_GUARDED_BY(mu);
  std::vector<std::thread> writers;

  void WriterLoop() {
    for (;;) {
      std::pair<int, uint64_t> job;
      {
        AnnotatedMutexLock lock(&mu);
        Await(mu, absl::Condition(
                      +[](Impl* self) ABSL_SHARED_LOCKS_REQUIRED(self->mu) {
                        return self->closing || !self->pending.empty();
                      },
                      this));
        if (pending.empty()) return;
        job = pending.front();
        pending.pop_front();
      }
      absl::Status s = PwriteAll(fd, buffers[job.first].get(), kBlockBytes, job.second, path);
      AnnotatedMutexLock lock(&mu);
      if (!s.ok() && error.ok()) error = s;
      free_list.push_back(job.first);
    }
  }

  // Queues the current (full) buffer and waits for a free one.
  absl::Status SubmitCurrent() {
    AnnotatedMutexLock lock(&mu);
    if (!error.ok()) return error;
    pending.emplace_back(current, file_offset);
    file_offset += kBlockBytes;
    Await(mu, absl::Condition(
                  +[](Impl* self) ABSL_SHARED_LOCKS_REQUIRED(self->mu) {
                    return !self->free_list.empty() || !self->error.ok();
                  },
                  this));
    if (!error.ok()) return error;
    current = free_list.front();
    free_list.pop_front();
    fill = 0;
    return absl::OkStatus();
  }

  absl::Status StopWriter() {
    {
      AnnotatedMutexLock lock(&mu);
      closing = true;
    }
    for (std::thread& t : writers) t.join();
    writers.clear();
    AnnotatedMutexLock lock(&mu);
    return error;
  }
};

SequentialWriter::SequentialWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<SequentialWriter>> SequentialWriter::Create(
    const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->partial_path = path + ".partial";
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  impl->fd = ::open(impl->partial_path.c_str(), flags | O_DIRECT, 0644);
  impl->direct = impl->fd >= 0;
  if (impl->fd < 0 && errno == EINVAL) {  // tmpfs and some FUSE mounts refuse O_DIRECT
    impl->fd = ::open(impl->partial_path.c_str(), flags, 0644);
  }
  if (impl->fd < 0) return ErrnoStatus(errno, absl::StrCat("creating ", impl->partial_path));
  for (int i = 0; i < Impl::kBuffers; ++i) {
    impl->buffers.push_back(AllocateAligned(kBlockBytes));
    if (!impl->buffers.back()) return absl::ResourceExhaustedError("out of memory for buffers");
  }
  {
    AnnotatedMutexLock lock(&impl->mu);
    for (int i = 1; i < Impl::kBuffers; ++i) impl->free_list.push_back(i);
  }
  Impl* raw = impl.get();
  for (int i = 0; i < Impl::kWriters; ++i) impl->writers.emplace_back([raw] { raw->WriterLoop(); });
  return std::unique_ptr<SequentialWriter>(new SequentialWriter(std::move(impl)));
}

SequentialWriter::~SequentialWriter() {
  if (!impl_) return;
  impl_->StopWriter().IgnoreError();
  if (impl_->fd >= 0) ::close(impl_->fd);
  if (!impl_->committed) ::unlink(impl_->partial_path.c_str());
}

std::span<uint8_t> SequentialWriter::Reserve(size_t max_bytes) {
  size_t room = kBlockBytes - impl_->fill;
  return {impl_->buffers[impl_->current].get() + impl_->fill, std::min(room, max_bytes)};
}

absl::Status SequentialWriter::Advance(size_t bytes) {
  impl_->fill += bytes;
  total_ += bytes;
  if (impl_->fill == kBlockBytes) return impl_->SubmitCurrent();
  return absl::OkStatus();
}

absl::Status SequentialWriter::Append(std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    std::span<uint8_t> dst = Reserve(bytes.size());
    std::memcpy(dst.data(), bytes.data(), dst.size());
    bytes = bytes.subspan(dst.size());
    absl::Status s = Advance(dst.size());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status SequentialWriter::Commit() {
  Impl& im = *impl_;
  absl::Status s = im.StopWriter();
  if (s.ok() && im.fill > 0) {
    // O_DIRECT needs a whole aligned block: write the tail padded, then cut the file to size.
    size_t padded = im.direct ? (im.fill + 4095) / 4096 * 4096 : im.fill;
    std::memset(im.buffers[im.current].get() + im.fill, 0, padded - im.fill);
    s = PwriteAll(im.fd, im.buffers[im.current].get(), padded, im.file_offset, im.path);
  }
  if (s.ok() && ::ftruncate(im.fd, static_cast<off_t>(total_)) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("truncating ", im.partial_path));
  }
  if (s.ok() && ::fsync(im.fd) != 0) s = ErrnoStatus(errno, absl::StrCat("syncing ", im.path));
  if (s.ok() && ::rename(im.partial_path.c_str(), im.path.c_str()) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("renaming ", im.partial_path, " to ", im.path));
  }
  if (s.ok()) im.committed = true;
  return s;
}

}  // namespace k3::io
