// The read router: one read engine per device, each read split over the devices that hold its
// bytes so that the parts land together (io/read_router.h).
//
// Locking: one mutex guards the router. It is held while a part is submitted to or cancelled in
// a device's engine, and the engines call back (OnPart) without their own locks held and never
// inside Submit or Cancel: the order is always router, then engine.
#include "io/read_router.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "io/aligned_buffer.h"
#include "io/tsan_mutex.h"

namespace k3::io {
namespace {

// What a device is assumed to deliver until it has been measured (a profile's bandwidth when
// it has one): a guess only orders the first reads, the measured rate soon replaces it.
constexpr double kUnmeasuredRate = 2e9;
// Rates are measured over windows of this many bytes delivered, and each window's figure is
// averaged with the rate before (a noisy window moves the plan half way).
constexpr uint64_t kRateWindowBytes = 32 << 20;

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

struct Inode {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const Inode& o) const { return dev == o.dev && ino == o.ino; }
};

absl::StatusOr<Inode> InodeOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::ErrnoToStatus(errno, path);
  return Inode{st.st_dev, st.st_ino};
}

}  // namespace

struct ReadRouter::Impl {
  struct Device {
    std::string key;  // "dev:MAJ:MIN" or "volume:N"
    DeviceReport report;
    StorageProfile profile;
    std::unique_ptr<ReadEngine> engine;
    uint64_t outstanding = 0;  // bytes of parts routed here and not delivered (waiting too)
    int in_flight = 0;         // parts at the engine
    // Parts routed here beyond the parts in flight a drive gets, by priority: (request, part).
    std::deque<std::pair<ReadId, size_t>> waiting[kNumPriorities];
    absl::Time busy_since;
    bool measured = false;
    uint64_t window_bytes = 0;
    double window_busy = 0;  // busy seconds when the window opened

    double busy_now(absl::Time now) const {
      return report.busy_seconds + (in_flight > 0 ? absl::ToDoubleSeconds(now - busy_since) : 0);
    }
    // When the bytes already asked of it will have arrived, from now.
    double backlog() const { return static_cast<double>(outstanding) / report.rate; }
  };

  // A place the bytes of a file can be read from.
  struct Source {
    int device = 0;
    FileId file = -1;  // in the device's engine
    std::string path;
    bool stripe = false;
    uint64_t begin = 0, end = 0;  // the file's range it holds (stripes)
    int64_t delta = 0;            // its offset minus the file's (stripes)
    bool bad = false;
  };

  struct File {
    std::string path;
    FileInfo info;
    // [0]: the file itself, then its copies, then the stripes by offset (from first_stripe).
    std::vector<Source> sources;
    size_t first_stripe = 0;
    std::vector<Extent> stripes;  // as opened
  };

  struct Part {
    int source = 0;
    uint64_t offset = 0, length = 0;
    std::span<uint8_t> buffer;
    ReadId inner = 0;  // at its device's engine; 0 while waiting
    bool done = false;
  };

  struct Request {
    ReadId id = 0;
    ReadRequest spec;
    std::vector<Part> parts;
    int open_parts = 0;
    absl::Status error;
    bool cancelled = false;
    absl::Time submitted;
    int retries = 0;
    bool logged = false;
  };

  struct Finished {
    ReadResult result;
    std::function<void(ReadResult)> callback;
  };

  explicit Impl(const ReadRouterOptions& o) : options(o) {}

  absl::StatusOr<int> DeviceFor(const std::string& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::StatusOr<int> AddSource(File& f, const std::string& path, Source s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::vector<int> Candidates(const File& f, uint64_t offset, uint64_t length) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::vector<Part> Split(const File& f, const std::vector<int>& candidates, uint64_t offset,
                          uint64_t length, std::span<uint8_t> buffer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status SubmitPart(Request& r, size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status Send(Request& r, size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Pump(Device& d, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool HasRoom(const Device& d, Priority p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void OnPart(ReadId id, size_t index, ReadResult result);
  bool FailOver(Request& r, size_t index, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Measure(Device& d, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Stop(Request& r, absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Finish(Request& r, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::optional<ReadResult> ClaimOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Warn(const std::string& text) const;
  static void Deliver(std::vector<Finished>& out) {
    for (Finished& f : out) f.callback(std::move(f.result));
  }

  const ReadRouterOptions options;
  std::vector<std::optional<Inode>> volume_inodes;  // of each volume's directory, if it exists

  mutable absl::Mutex mu;
  std::vector<std::unique_ptr<Device>> devices ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, FileId> opened ABSL_GUARDED_BY(mu);  // by path
  std::vector<File> files ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<ReadId, std::unique_ptr<Request>> live ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<ReadId, ReadResult> done ABSL_GUARDED_BY(mu);
  std::deque<ReadId> done_order ABSL_GUARDED_BY(mu);
  ReadId next_id ABSL_GUARDED_BY(mu) = 1;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool logging ABSL_GUARDED_BY(mu) = false;
  std::vector<std::pair<ReadId, LoggedRead>> log ABSL_GUARDED_BY(mu);
};

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
// Routing.

// The sources that can serve the whole range, one per device. A range a stripe holds is read
// from the stripes and the volumes' copies, not from the file itself, which may have given its
// space back (k3 stripe --punch).
std::vector<int> ReadRouter::Impl::Candidates(const File& f, uint64_t offset,
                                              uint64_t length) const {
  const uint64_t end = offset + length;
  // The stripes that may hold the range: those starting at the last start at or before it
  // (pieces are disjoint, or the same piece in several directories).
  const auto stripes = std::span(f.sources).subspan(f.first_stripe);
  auto after = std::upper_bound(stripes.begin(), stripes.end(), offset,
                                [](uint64_t at, const Source& s) { return at < s.begin; });
  size_t from = f.sources.size();
  if (after != stripes.begin()) {
    const uint64_t begin = std::prev(after)->begin;
    for (auto it = std::prev(after); it->begin == begin; --it) {
      from = f.first_stripe + static_cast<size_t>(it - stripes.begin());
      if (it == stripes.begin()) break;
    }
  }
  const size_t to = f.first_stripe + static_cast<size_t>(after - stripes.begin());
  bool striped = false;
  for (size_t i = from; i < to; ++i) striped |= end <= f.sources[i].end;
  std::vector<int> out;
  std::vector<int> seen_devices;
  for (size_t i = 0; i < to; ++i) {
    if (i == f.first_stripe) i = std::max(i, from);
    if (i >= to) break;
    const Source& s = f.sources[i];
    if (s.bad) continue;
    if (s.stripe ? end > s.end : (i == 0 && striped)) continue;
    if (std::find(seen_devices.begin(), seen_devices.end(), s.device) != seen_devices.end()) {
      continue;
    }
    seen_devices.push_back(s.device);
    out.push_back(static_cast<int>(i));
  }
  return out;
}

// Parts of [offset, offset + length) for the candidates, sized so that each device finishes
// its part at the same time given what it is already reading and its rate (water filling), no
// part shorter than min_part_bytes, boundaries at 4 KiB so that every part reads straight into
// its place in the buffer.
std::vector<ReadRouter::Impl::Part> ReadRouter::Impl::Split(const File& f,
                                                            const std::vector<int>& candidates,
                                                            uint64_t offset, uint64_t length,
                                                            std::span<uint8_t> buffer) const {
  struct Share {
    int source;
    double backlog, rate, bytes;
  };
  std::vector<Share> shares;
  for (int c : candidates) {
    const Device& d = *devices[f.sources[c].device];
    shares.push_back({c, d.backlog(), d.report.rate, 0});
  }
  std::stable_sort(shares.begin(), shares.end(),
                   [](const Share& a, const Share& b) { return a.backlog < b.backlog; });
  const double total = static_cast<double>(length);
  const double min_part = static_cast<double>(options.min_part_bytes);
  for (;;) {
    // The time T at which the devices used finish together: sum over them of
    // (T - backlog) * rate = length, using every device whose backlog ends before T.
    double weighted = 0, rates = 0, finish = 0;
    size_t used = 0;
    for (; used < shares.size(); ++used) {
      const double t = (total + weighted + shares[used].backlog * shares[used].rate) /
                       (rates + shares[used].rate);
      if (used > 0 && shares[used].backlog >= finish) break;
      weighted += shares[used].backlog * shares[used].rate;
      rates += shares[used].rate;
      finish = t;
    }
    shares.resize(used);
    auto smallest = shares.begin();
    for (auto it = shares.begin(); it != shares.end(); ++it) {
      it->bytes = (finish - it->backlog) * it->rate;
      if (it->bytes < smallest->bytes) smallest = it;
    }
    if (shares.size() == 1 || smallest->bytes >= min_part) break;
    shares.erase(smallest);
  }
  std::vector<Part> parts;
  const uint64_t head = AlignDown(offset);
  uint64_t at = offset;
  double planned = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    planned += shares[i].bytes;
    uint64_t to = offset + length;
    if (i + 1 < shares.size()) {
      to = std::clamp<uint64_t>(AlignDown(offset + static_cast<uint64_t>(planned)), at, to);
    }
    if (to == at && i + 1 < shares.size()) continue;
    const uint64_t start = at == offset ? head : at;
    parts.push_back({.source = shares[i].source,
                     .offset = at,
                     .length = to - at,
                     .buffer = buffer.subspan(start - head)});
    at = to;
  }
  return parts;
}

// With several drives each keeps few parts in flight, the rest waiting here by priority: a
// drive given a whole layer's reads at once serves them in its own order and they all land at
// the end of the layer, where in order the first experts multiply while the rest arrive (on
// three emulated drives sharing one disk, 32 in flight each doubled a decode token's time).
// Prefetches leave one place free, so that a demand read never waits behind guesses.
bool ReadRouter::Impl::HasRoom(const Device& d, Priority p) const {
  if (devices.size() < 2) return true;
  const int most = std::min(options.engine.queue_depth, options.parts_in_flight_per_drive);
  return d.in_flight < (p == Priority::kPrefetch && most > 1 ? most - 1 : most);
}

absl::Status ReadRouter::Impl::SubmitPart(Request& r, size_t index) {
  Part& p = r.parts[index];
  p.inner = 0;
  Device& d = *devices[files[r.spec.file].sources[p.source].device];
  if (!HasRoom(d, r.spec.priority)) {
    d.waiting[static_cast<int>(r.spec.priority)].emplace_back(r.id, index);
    d.outstanding += p.length;
    return absl::OkStatus();
  }
  absl::Status s = Send(r, index);
  if (s.ok()) d.outstanding += p.length;
  return s;
}

// The parts waiting for a drive, while it has room: demand first. A part of a request that has
// stopped meanwhile is done without a read.
void ReadRouter::Impl::Pump(Device& d, std::vector<Finished>* out) {
  for (int p = 0; p < kNumPriorities; ++p) {
    while (!d.waiting[p].empty() && HasRoom(d, static_cast<Priority>(p))) {
      const auto [id, index] = d.waiting[p].front();
      d.waiting[p].pop_front();
      Request& r = *live.at(id);
      Part& part = r.parts[index];
      if (!r.cancelled && r.error.ok() && !stopping) {
        absl::Status s = Send(r, index);
        if (s.ok()) continue;
        Stop(r, s);
      }
      d.outstanding -= part.length;
      part.done = true;
      if (--r.open_parts == 0) Finish(r, out);
    }
  }
}

absl::Status ReadRouter::Impl::Send(Request& r, size_t index) {
  Part& p = r.parts[index];
  File& f = files[r.spec.file];
  Source& s = f.sources[p.source];
  Device& d = *devices[s.device];
  const ReadId id = r.id;
  auto inner =
      d.engine->Submit({.file = s.file,
                        .offset = static_cast<uint64_t>(static_cast<int64_t>(p.offset) + s.delta),
                        .length = p.length,
                        .buffer = p.buffer,
                        .priority = r.spec.priority,
                        .on_complete = [this, id, index](ReadResult result) {
                          OnPart(id, index, std::move(result));
                        }});
  if (!inner.ok()) return inner.status();
  p.inner = *inner;
  if (d.in_flight++ == 0) d.busy_since = absl::Now();
  return absl::OkStatus();
}

void ReadRouter::Impl::Measure(Device& d, uint64_t bytes) {
  const absl::Time now = absl::Now();
  d.report.bytes += bytes;
  ++d.report.reads;
  d.window_bytes += bytes;
  const double busy = d.busy_now(now);
  if (d.window_bytes >= kRateWindowBytes && busy > d.window_busy) {
    const double rate = static_cast<double>(d.window_bytes) / (busy - d.window_busy);
    d.report.rate = d.measured ? (d.report.rate + rate) / 2 : rate;
    d.measured = true;
    d.window_bytes = 0;
    d.window_busy = busy;
  }
}

void ReadRouter::Impl::OnPart(ReadId id, size_t index, ReadResult result) {
  std::vector<Finished> out;
  {
    AnnotatedMutexLock lock(&mu);
    auto it = live.find(id);
    if (it == live.end()) return;  // cannot happen: a request lives until its parts are done
    Request& r = *it->second;
    Part& p = r.parts[index];
    const Source& s = files[r.spec.file].sources[p.source];
    Device& d = *devices[s.device];
    d.outstanding -= p.length;
    if (--d.in_flight == 0)
      d.report.busy_seconds += absl::ToDoubleSeconds(absl::Now() - d.busy_since);
    r.retries += result.retries;
    bool again = false;  // read from another copy
    if (result.status.ok()) {
      Measure(d, p.length);
    } else if (absl::IsCancelled(result.status) || r.cancelled || !r.error.ok() || stopping ||
               !FailOver(r, index, result.status)) {
      Stop(r, result.status);
    } else {
      again = true;
    }
    if (!again) {
      p.done = true;
      if (--r.open_parts == 0) Finish(r, &out);
    }
    Pump(d, &out);
  }
  Deliver(out);
}

// The part's copy failed (after the engine's own retries): read it from another one, and never
// read that copy again this run. False when no other copy holds the part.
bool ReadRouter::Impl::FailOver(Request& r, size_t index, const absl::Status& error) {
  Part& p = r.parts[index];
  File& f = files[r.spec.file];
  Source& failed = f.sources[p.source];
  const bool known = failed.bad;  // another read of it, in flight when it was set aside
  failed.bad = true;
  Device& from = *devices[failed.device];
  const std::vector<int> others = Candidates(f, p.offset, p.length);
  if (others.empty()) {  // the run stops on this error, as with one copy
    failed.bad = false;
    return false;
  }
  // The one that will finish first.
  int best = others[0];
  for (int c : others) {
    const Device& d = *devices[f.sources[c].device];
    const Device& b = *devices[f.sources[best].device];
    if (d.backlog() + p.length / d.report.rate < b.backlog() + p.length / b.report.rate) best = c;
  }
  const Source& to = f.sources[best];
  if (!known) {
    Warn(absl::StrCat(std::string(error.message()), " (device ", from.report.id,
                      "); read again from ", to.path, " (device ", devices[to.device]->report.id,
                      "), and ", failed.path, " is not read again"));
  }
  ++from.report.failovers;
  ++r.retries;
  p.source = best;
  if (absl::Status s = SubmitPart(r, index); !s.ok()) return false;
  return true;
}

// No more parts of `r` are wanted: it failed (or was cancelled); the parts in flight are
// cancelled and the request finishes when the last has landed.
void ReadRouter::Impl::Stop(Request& r, absl::Status error) {
  if (r.error.ok() && !r.cancelled) r.error = std::move(error);
  for (Part& p : r.parts) {
    if (!p.done && p.inner != 0) {
      devices[files[r.spec.file].sources[p.source].device]->engine->Cancel(p.inner);
    }
  }
}

void ReadRouter::Impl::Finish(Request& r, std::vector<Finished>* out) {
  const File& f = files[r.spec.file];
  ReadResult result{.id = r.id,
                    .user_data = r.spec.user_data,
                    .priority = r.spec.priority,
                    .latency = absl::Now() - r.submitted,
                    .retries = r.retries};
  if (r.cancelled) {
    result.status =
        absl::CancelledError(absl::StrCat("read of ", r.spec.length, " bytes at offset ",
                                          r.spec.offset, " of ", f.path, " cancelled"));
  } else if (!r.error.ok()) {
    result.status = r.error;
  } else {
    result.data = r.spec.buffer.subspan(r.spec.offset % kDirectAlignment, r.spec.length);
    if (r.logged && logging) {
      log.emplace_back(r.id, LoggedRead{.file = r.spec.file,
                                        .offset = r.spec.offset,
                                        .length = r.spec.length,
                                        .priority = r.spec.priority});
    }
  }
  if (r.spec.on_complete) {
    out->push_back({std::move(result), std::move(r.spec.on_complete)});
  } else {
    done_order.push_back(r.id);
    done.emplace(r.id, std::move(result));
  }
  live.erase(r.id);
}

std::optional<ReadResult> ReadRouter::Impl::ClaimOldest() {
  while (!done_order.empty()) {
    const ReadId id = done_order.front();
    done_order.pop_front();
    auto d = done.find(id);
    if (d == done.end()) continue;  // claimed by Wait()
    ReadResult result = std::move(d->second);
    done.erase(d);
    return result;
  }
  return std::nullopt;
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
  const AlignedExtent extent = ExtentFor(request.offset, request.length);
  if (reinterpret_cast<uintptr_t>(request.buffer.data()) % kDirectAlignment != 0) {
    return absl::InvalidArgumentError("read buffer is not 4 KiB-aligned");
  }
  if (request.buffer.size() < extent.aligned_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "read buffer of ", request.buffer.size(), " bytes is too small: ", request.length,
        " bytes at offset ", request.offset, " need ", extent.aligned_length));
  }
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
    const std::vector<int> candidates = m.Candidates(f, request.offset, request.length);
    if (candidates.empty()) {
      return absl::UnavailableError(absl::StrCat("no readable copy of ", request.length,
                                                 " bytes at offset ", request.offset, " of ",
                                                 f.path, " is left (each failed before)"));
    }
    auto r = std::make_unique<Impl::Request>();
    id = r->id = m.next_id++;
    r->submitted = absl::Now();
    r->logged = m.logging;
    r->parts = m.Split(f, candidates, request.offset, request.length, request.buffer);
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

absl::StatusOr<std::span<uint8_t>> ReadRouter::Read(ReadRequest request) {
  if (request.on_complete) return absl::InvalidArgumentError("Read() takes no callback");
  auto id = Submit(std::move(request));
  if (!id.ok()) return id.status();
  ReadResult r = Wait(*id);
  if (!r.status.ok()) return r.status;
  return r.data;
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
  auto d = m.done.find(id);
  if (d == m.done.end()) {
    return {.id = id,
            .status = absl::NotFoundError(absl::StrCat("no unclaimed read with id ", id))};
  }
  ReadResult result = std::move(d->second);
  m.done.erase(d);
  return result;
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
  // Completion order, which depends on the devices; a replay issues them as they were asked.
  std::sort(impl_->log.begin(), impl_->log.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<LoggedRead> reads;
  reads.reserve(impl_->log.size());
  for (const auto& entry : impl_->log) reads.push_back(entry.second);
  impl_->log.clear();
  return reads;
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

EngineStats ReadRouter::stats() const {
  AnnotatedMutexLock lock(&impl_->mu);
  EngineStats sum;
  for (const auto& d : impl_->devices) {
    const EngineStats s = d->engine->stats();
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

}  // namespace k3::io
