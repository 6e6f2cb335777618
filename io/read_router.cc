// The read router's setup and caller side: the devices and files, opening copies and stripes,
// submitting, waiting, cancelling, and the public ReadRouter. How reads are split over the drives
// and what becomes of their parts is io/read_routing.cc.
#include "io/read_router.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "io/read_router_impl.h"
#include "io/tsan_mutex.h"

namespace k3::io {

using router_internal::BaseOf;
using router_internal::DirOf;
using router_internal::Inode;
using router_internal::InodeOf;
using router_internal::kUnmeasuredRate;

// ---------------------------------------------------------------------------------------------
// Devices and files.

void ReadRouter::Impl::Warn(const std::string& text) const {
  if (options.on_warning) return options.on_warning(text);
  std::fprintf(stderr, "k3: warning: %s\n", text.c_str());
}

// The device that reads files in `dir`: the volume's own drive when the directory is a volume
// with a profile of its own, else its file system's.
absl::StatusOr<int> ReadRouter::Impl::DeviceFor(const std::string& dir) {
  auto inode = InodeOf(dir);
  if (!inode.ok()) return inode.status();
  std::string key = absl::StrCat("dev:", major(inode->dev), ":", minor(inode->dev));
  std::string id = absl::StrCat(major(inode->dev), ":", minor(inode->dev));
  StorageProfile profile = options.engine.profile;
  for (size_t v = 0; v < options.volumes.size(); ++v) {
    if (!options.volumes[v].profile || volume_inodes[v] != *inode) continue;
    key = absl::StrCat("volume:", v);
    id = options.volumes[v].dir;
    profile = *options.volumes[v].profile;
    break;
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    if (devices[d]->key != key) continue;
    auto& dirs = devices[d]->report.dirs;
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
    return static_cast<int>(d);
  }
  ReadEngineOptions engine_options = options.engine;
  engine_options.profile = profile;
  auto engine = ReadEngine::Create(engine_options);
  if (!engine.ok()) return engine.status();
  auto d = std::make_unique<Device>();
  d->key = key;
  d->profile = profile;
  d->engine = *std::move(engine);
  d->report = {.id = id,
               .dirs = {dir},
               .profile = profile.Describe(),
               .queue_depth = engine_options.queue_depth,
               .rate = profile.bytes_per_second > 0 ? profile.bytes_per_second : kUnmeasuredRate};
  devices.push_back(std::move(d));
  return static_cast<int>(devices.size() - 1);
}

absl::StatusOr<int> ReadRouter::Impl::AddSource(File& f, const std::string& path, Source s) {
  auto device = DeviceFor(DirOf(path));
  if (!device.ok()) return device.status();
  // A second name for a file on the same drive adds no bandwidth (and no queue).
  for (const Source& other : f.sources) {
    if (!s.stripe && !other.stripe && other.device == *device) return -1;
  }
  // A stripe file holds pieces of many files: opened once.
  auto known = opened.find(path);
  if (known == opened.end()) {
    auto id = devices[*device]->engine->OpenFile(path);
    if (!id.ok()) return id.status();
    known = opened.emplace(path, *id).first;
  }
  const FileId* id = &known->second;
  s.device = *device;
  s.file = *id;
  s.path = path;
  f.sources.push_back(std::move(s));
  return static_cast<int>(f.sources.size() - 1);
}

// ---------------------------------------------------------------------------------------------
// ReadRouter.

ReadRouter::ReadRouter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ReadRouter::~ReadRouter() {
  {
    AnnotatedMutexLock lock(&impl_->mu);
    impl_->stopping = true;
  }
  // Outside the lock: an engine going away delivers its parts' results, which take it.
  for (size_t d = 0;; ++d) {
    std::unique_ptr<ReadEngine> engine;
    {
      AnnotatedMutexLock lock(&impl_->mu);
      if (d >= impl_->devices.size()) break;
      engine = std::move(impl_->devices[d]->engine);
    }
    engine.reset();
  }
}

absl::StatusOr<std::unique_ptr<ReadRouter>> ReadRouter::Create(const ReadRouterOptions& options) {
  if (options.engine.queue_depth < 1) {
    return absl::InvalidArgumentError("queue depth must be at least 1");
  }
  auto impl = std::make_unique<Impl>(options);
  for (const Volume& v : options.volumes) {
    auto inode = InodeOf(v.dir);
    if (!inode.ok()) {
      return absl::NotFoundError(absl::StrCat("--volume ", v.dir, ": ",
                                              std::string(inode.status().message()),
                                              " (not a directory that can be read)"));
    }
    impl->volume_inodes.push_back(*inode);
  }
  return std::unique_ptr<ReadRouter>(new ReadRouter(std::move(impl)));
}

absl::StatusOr<FileId> ReadRouter::OpenFile(const std::string& path, std::vector<Extent> stripes) {
  Impl& m = *impl_;
  auto original = InodeOf(path);
  if (!original.ok()) return original.status();
  // The copies in the volumes, checked before any is opened (outside the lock: they read).
  std::vector<std::string> copies;
  for (const Volume& v : m.options.volumes) {
    const std::string copy = absl::StrCat(v.dir, "/", BaseOf(path));
    auto inode = InodeOf(copy);
    if (!inode.ok()) continue;                        // a volume may hold any subset of the files
    if (*inode == *original && !v.profile) continue;  // the file itself, by another name
    const CopyCheck check = *inode == *original ? CopyCheck::kSize : m.options.check;
    if (absl::Status s = CheckCopy(path, copy, check); !s.ok()) {
      m.Warn(absl::StrCat(std::string(s.message()), "; ", copy, " is not read"));
      continue;
    }
    copies.push_back(copy);
  }
  AnnotatedMutexLock lock(&m.mu);
  Impl::File f;
  f.path = path;
  f.stripes = stripes;
  if (auto s = m.AddSource(f, path, {}); !s.ok()) return s.status();
  const Impl::Source& self = f.sources[0];
  f.info = m.devices[self.device]->engine->file(self.file);
  for (const std::string& copy : copies) {
    if (auto s = m.AddSource(f, copy, {}); !s.ok()) return s.status();
  }
  f.first_stripe = f.sources.size();
  std::stable_sort(stripes.begin(), stripes.end(),
                   [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
  for (Extent& e : stripes) {
    if (e.at % kDirectAlignment != e.offset % kDirectAlignment) {
      return absl::InvalidArgumentError(
          absl::StrCat(e.path, " holds bytes of ", path, " at offset ", e.at, " where they are at ",
                       e.offset, ": the two must be equal modulo 4096"));
    }
    if (e.offset + e.length > f.info.size) {
      return absl::OutOfRangeError(absl::StrCat(e.path, " claims bytes ", e.offset, "..",
                                                e.offset + e.length, " of ", path, ", which has ",
                                                f.info.size));
    }
    Impl::Source s{.stripe = true,
                   .begin = e.offset,
                   .end = e.offset + e.length,
                   .delta = static_cast<int64_t>(e.at) - static_cast<int64_t>(e.offset)};
    if (auto added = m.AddSource(f, e.path, std::move(s)); !added.ok()) return added.status();
  }
  m.files.push_back(std::move(f));
  return static_cast<FileId>(m.files.size() - 1);
}

FileInfo ReadRouter::file(FileId id) const {
  AnnotatedMutexLock lock(&impl_->mu);
  if (id < 0 || static_cast<size_t>(id) >= impl_->files.size()) return {};
  return impl_->files[id].info;
}

std::vector<std::string> ReadRouter::copies(FileId id) const {
  AnnotatedMutexLock lock(&impl_->mu);
  std::vector<std::string> out;
  if (id < 0 || static_cast<size_t>(id) >= impl_->files.size()) return out;
  for (size_t i = 1; i < impl_->files[id].sources.size(); ++i) {
    const std::string& path = impl_->files[id].sources[i].path;
    if (std::find(out.begin(), out.end(), path) == out.end()) out.push_back(path);
  }
  return out;
}

std::vector<Extent> ReadRouter::stripes(FileId id) const {
  AnnotatedMutexLock lock(&impl_->mu);
  if (id < 0 || static_cast<size_t>(id) >= impl_->files.size()) return {};
  return impl_->files[id].stripes;
}

absl::StatusOr<ReadId> ReadRouter::Submit(ReadRequest request) {
  Impl& m = *impl_;
  if (absl::Status s = internal::CheckReadBuffer(request); !s.ok()) return s;
  ReadId id;
  {
    AnnotatedMutexLock lock(&m.mu);
    if (request.file < 0 || static_cast<size_t>(request.file) >= m.files.size()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown file id ", request.file));
    }
    const Impl::File& f = m.files[request.file];
    if (request.offset + request.length > f.info.size) {
      return absl::OutOfRangeError(absl::StrCat("reading ", request.length, " bytes at offset ",
                                                request.offset, " of ", f.path, ": past its end (",
                                                f.info.size, " bytes)"));
    }
    if (m.stopping) return absl::FailedPreconditionError("the read router is shutting down");
    // Each segment (a piece of a sliced layout, or the whole read) split over its drives.
    std::vector<Impl::Part> parts;
    const uint64_t head = AlignDown(request.offset);
    for (const auto& [offset, length] : m.Segments(f, request.offset, request.length)) {
      const std::vector<int> candidates = m.Candidates(f, offset, length);
      if (candidates.empty()) {
        return absl::UnavailableError(absl::StrCat("no readable copy of ", length,
                                                   " bytes at offset ", offset, " of ", f.path,
                                                   " is left (each failed before)"));
      }
      const std::span<uint8_t> buffer = request.buffer.subspan(AlignDown(offset) - head);
      for (Impl::Part& p : m.Split(f, candidates, offset, length, buffer)) parts.push_back(p);
    }
    auto r = std::make_unique<Impl::Request>();
    id = r->id = m.next_id++;
    r->submitted = absl::Now();
    r->logged = m.logging;
    r->parts = std::move(parts);
    r->spec = std::move(request);
    r->open_parts = static_cast<int>(r->parts.size());
    Impl::Request& raw = *r;
    m.live.emplace(id, std::move(r));
    for (size_t i = 0; i < raw.parts.size(); ++i) {
      absl::Status s = m.SubmitPart(raw, i);
      if (s.ok()) continue;
      // Refused at once (the ranges were checked, so this is rare): an error of Submit when
      // nothing is in flight yet, else the request ends with it when its parts have landed.
      if (i == 0) {
        m.live.erase(id);
        return s;
      }
      m.Stop(raw, s);
      raw.open_parts -= static_cast<int>(raw.parts.size() - i);
      for (size_t j = i; j < raw.parts.size(); ++j) raw.parts[j].done = true;
      break;
    }
  }
  return id;
}

ReadResult ReadRouter::Wait(ReadId id) {
  Impl& m = *impl_;
  AnnotatedMutexLock lock(&m.mu);
  auto it = m.live.find(id);
  if (it != m.live.end() && it->second->spec.on_complete) {
    return {.id = id, .status = absl::InvalidArgumentError("this read delivers to a callback")};
  }
  auto ready = [&m, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(m.mu) {
    return m.done.contains(id) || !m.live.contains(id);
  };
  Await(m.mu, absl::Condition(&ready));
  if (auto result = m.done.Claim(id)) return *std::move(result);
  return {.id = id, .status = absl::NotFoundError(absl::StrCat("no unclaimed read with id ", id))};
}

std::optional<ReadResult> ReadRouter::Poll() {
  AnnotatedMutexLock lock(&impl_->mu);
  return impl_->ClaimOldest();
}

std::optional<ReadResult> ReadRouter::WaitAny(absl::Duration timeout) {
  Impl& m = *impl_;
  AnnotatedMutexLock lock(&m.mu);
  auto ready = [&m]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(m.mu) { return !m.done.empty(); };
  AwaitWithTimeout(m.mu, absl::Condition(&ready), timeout);
  return m.ClaimOldest();
}

bool ReadRouter::Cancel(ReadId id) {
  AnnotatedMutexLock lock(&impl_->mu);
  auto it = impl_->live.find(id);
  if (it == impl_->live.end()) return false;
  Impl::Request& r = *it->second;
  if (!r.cancelled) {
    r.cancelled = true;
    impl_->Stop(r, absl::CancelledError("cancelled"));
  }
  return true;
}

int ReadRouter::CancelPrefetches(std::function<bool(uint64_t user_data)> filter) {
  AnnotatedMutexLock lock(&impl_->mu);
  int count = 0;
  for (auto& [id, r] : impl_->live) {
    if (r->spec.priority != Priority::kPrefetch || r->cancelled) continue;
    if (filter && !filter(r->spec.user_data)) continue;
    r->cancelled = true;
    impl_->Stop(*r, absl::CancelledError("cancelled"));
    ++count;
  }
  return count;
}

void ReadRouter::StartLog() {
  AnnotatedMutexLock lock(&impl_->mu);
  impl_->logging = true;
  impl_->log.clear();
}

std::vector<LoggedRead> ReadRouter::TakeLog() {
  AnnotatedMutexLock lock(&impl_->mu);
  impl_->logging = false;
  return internal::InRequestOrder(std::exchange(impl_->log, {}));
}

std::string_view ReadRouter::backend_name() const {
  AnnotatedMutexLock lock(&impl_->mu);
  return impl_->devices.empty() ? "io_uring" : impl_->devices[0]->engine->backend_name();
}

bool ReadRouter::buffers_registered() const {
  AnnotatedMutexLock lock(&impl_->mu);
  for (const auto& d : impl_->devices) {
    if (!d->engine->buffers_registered()) return false;
  }
  return !impl_->devices.empty();
}

const ReadRouterOptions& ReadRouter::options() const { return impl_->options; }

ReadStats ReadRouter::stats() const {
  AnnotatedMutexLock lock(&impl_->mu);
  ReadStats sum;
  for (const auto& d : impl_->devices) {
    const ReadStats s = d->engine->stats();
    sum.completed += s.completed;
    sum.failed += s.failed;
    sum.cancelled += s.cancelled;
    sum.bytes_delivered += s.bytes_delivered;
    sum.bytes_read += s.bytes_read;
    sum.operations += s.operations;
    sum.short_reads += s.short_reads;
    sum.transient_retries += s.transient_retries;
    sum.error_retries += s.error_retries;
    sum.peak_requests_in_flight = std::max(sum.peak_requests_in_flight, s.peak_requests_in_flight);
    sum.peak_operations_in_flight =
        std::max(sum.peak_operations_in_flight, s.peak_operations_in_flight);
  }
  return sum;
}

std::vector<DeviceReport> ReadRouter::devices() const {
  AnnotatedMutexLock lock(&impl_->mu);
  const absl::Time now = absl::Now();
  std::vector<DeviceReport> out;
  for (const auto& d : impl_->devices) {
    out.push_back(d->report);
    out.back().busy_seconds = d->busy_now(now);
  }
  return out;
}

std::vector<DeviceReport> DevicesSince(const std::vector<DeviceReport>& before,
                                       const std::vector<DeviceReport>& after) {
  std::vector<DeviceReport> out = after;
  for (DeviceReport& d : out) {
    const auto was = std::find_if(before.begin(), before.end(),
                                  [&](const DeviceReport& b) { return b.id == d.id; });
    if (was == before.end()) continue;
    d.bytes -= std::min(d.bytes, was->bytes);
    d.reads -= std::min(d.reads, was->reads);
    d.busy_seconds = std::max(0.0, d.busy_seconds - was->busy_seconds);
    d.failovers -= std::min(d.failovers, was->failovers);
  }
  return out;
}

}  // namespace k3::io
