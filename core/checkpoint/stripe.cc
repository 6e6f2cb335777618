#include "core/checkpoint/stripe.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint/stripe_manifest.h"
#include "core/checkpoint/trunk_codec.h"
#include "core/checkpoint/trunk_pack.h"
#include "io/aligned_buffer.h"
#include "io/file.h"

namespace k3 {
namespace {

// Reads, copies and checks in pieces of this size (an expert of the release is 17.5 MB).
constexpr uint64_t kStripeChunkBytes = 4 << 20;

std::string FileName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status RemoveStripeFile(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("removing ", path, ": ", std::strerror(errno)));
}

// ---- Reading ranges -----------------------------------------------------------------------

// Reads [offset, offset + length) of `file` piece by piece (O_DIRECT where the file system
// allows) into `buffer` (4 KiB aligned, kStripeChunkBytes + 8 KiB), hands each piece to `each`
// and returns the CRC-32C of the range.
absl::StatusOr<uint32_t> ReadRange(
    const io::RandomAccessFile& file, uint64_t offset, uint64_t length, std::span<uint8_t> buffer,
    const std::function<absl::Status(std::span<const uint8_t>)>& each = {}) {
  uint32_t crc = 0;
  for (uint64_t done = 0; done < length;) {
    const uint64_t n = std::min(length - done, kStripeChunkBytes);
    auto got = file.ReadDirect(offset + done, n, buffer);
    if (!got.ok()) return got.status();
    crc = Crc32c(crc, got->data(), got->size());
    if (each) {
      if (absl::Status s = each(*got); !s.ok()) return s;
    }
    done += n;
  }
  return crc;
}

absl::StatusOr<std::unique_ptr<io::BufferArena>> RangeBuffer() {
  return io::BufferArena::Create(kStripeChunkBytes + 2 * io::kDirectAlignment);
}

std::span<uint8_t> Whole(const io::BufferArena& arena) { return {arena.data(), arena.size()}; }

// The CRC a data file's extent reads back with, against the manifest's.
absl::Status CheckExtent(const io::RandomAccessFile& file, const StripeExtent& e,
                         std::span<uint8_t> buffer) {
  auto crc = ReadRange(file, e.at, e.length, buffer);
  if (!crc.ok()) return crc.status();
  if (*crc == e.crc) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      e.path, ": the extent at offset ", e.at, " (", e.length, " bytes, expert ", e.expert,
      " of layer ", e.layer, ", offset ", e.offset, " of ", e.shard, ") has CRC-32C ", *crc,
      ", not the manifest's ", e.crc, ": the stripe is damaged (k3 stripe --force rewrites it)"));
}

// Runs fn(i, stop) for i in [0, n), one thread each when n > 1. The first failure sets `stop`,
// which the others check between extents (a failed drive should not wait for hours of copying
// to the others), and is what returns.
absl::Status ForEachDirectory(
    int n, const std::function<absl::Status(int, const std::atomic<bool>&)>& fn) {
  std::atomic<bool> stop = false;
  std::mutex mu;
  absl::Status first;
  auto run = [&](int i) {
    absl::Status s = fn(i, stop);
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (first.ok()) first = s;
    stop = true;
  };
  if (n == 1) {
    run(0);
  } else {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back(run, i);
    for (std::thread& t : threads) t.join();
  }
  return first;
}

absl::Status Stopped() { return absl::AbortedError("stopped after a failure elsewhere"); }

// Bytes done of a phase, summed over the threads; the callback is called under a lock.
class PhaseProgress {
 public:
  PhaseProgress(const StripeOptions& options, std::string_view phase, uint64_t total)
      : options_(options), phase_(phase), total_(total) {}
  void Add(uint64_t n) {
    if (!options_.progress) return;
    std::lock_guard<std::mutex> lock(mu_);
    done_ += n;
    options_.progress(phase_, done_, total_);
  }

 private:
  const StripeOptions& options_;
  std::string_view phase_;
  uint64_t total_;
  std::mutex mu_;
  uint64_t done_ = 0;
};

// ---- The manifest against the checkpoint --------------------------------------------------

absl::flat_hash_map<std::string, int> ShardsByName(const Checkpoint& ckpt) {
  absl::flat_hash_map<std::string, int> by_name;
  for (size_t i = 0; i < ckpt.shard_paths().size(); ++i) {
    by_name[FileName(ckpt.shard_paths()[i])] = static_cast<int>(i);
  }
  return by_name;
}

uint64_t SizeOf(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

absl::Status CheckAgainst(const Checkpoint& ckpt, const StripeManifest& m) {
  const std::string expected = ckpt.config().Fingerprint();
  if (m.fingerprint != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        m.path, ": fingerprint ", m.fingerprint, " does not match the config of ", ckpt.dir(), " (",
        expected, "): the stripes were made from another model; re-run k3 stripe"));
  }
  const auto shards = ShardsByName(ckpt);
  for (const StripeManifest::Shard& s : m.shards) {
    auto it = shards.find(s.name);
    if (it == shards.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(m.path, ": shard ", s.name, " is not a shard of ", ckpt.dir()));
    }
    const uint64_t size = SizeOf(ckpt.shard_paths()[it->second]);
    if (size != s.bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(m.path, ": shard ", s.name, " was ", s.bytes, " bytes when striped; ",
                       ckpt.shard_paths()[it->second], " is ", size, ": re-run k3 stripe"));
    }
  }
  const ModelConfig& c = ckpt.config();
  for (const StripeExtent& e : m.extents) {
    const bool moe =
        e.layer >= c.first_k_dense_replace && e.layer < c.num_layers && e.expert < c.num_experts;
    const ExpertLocation* loc = moe ? &ckpt.expert(e.layer, e.expert) : nullptr;
    // Where the extent must be: the expert's span, or this directory's piece of it.
    ByteSpan want = loc != nullptr && loc->contiguous() ? loc->spans[0] : ByteSpan{.shard = -1};
    if (m.layout == StripeLayout::kSlices && want.shard >= 0) {
      want = SliceOf(want, m.weights, m.directory);
    }
    if (want.shard != shards.at(e.shard) || want.offset != e.offset || want.length != e.length) {
      return absl::InvalidArgumentError(absl::StrCat(
          m.path, ": expert ", e.expert, " of layer ", e.layer, " is recorded at offset ", e.offset,
          " (", e.length, " bytes) of ", e.shard, ", which is not where the checkpoint has ",
          m.layout == StripeLayout::kSlices ? "this directory's slice of it" : "it as one span",
          ": re-run k3 stripe"));
    }
  }
  for (const StripeManifest::File& f : m.files) {
    const std::string path = io::JoinPath(m.Dir(), f.name);
    if (!io::FileExists(path)) {
      return absl::NotFoundError(absl::StrCat(path, " does not exist (", m.path, " lists it)"));
    }
    const uint64_t size = SizeOf(path);
    if (size < f.bytes) {
      return absl::DataLossError(absl::StrCat(path, " is ", size, " bytes, shorter than the ",
                                              f.bytes, " that ", m.path, " records (truncated?)"));
    }
    if (size > f.bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is ", size, " bytes, but ", m.path, " records ", f.bytes));
    }
  }
  return absl::OkStatus();
}

// The manifests of the directories that have one, parsed and checked against the checkpoint.
absl::StatusOr<std::vector<StripeManifest>> OpenManifests(const Checkpoint& ckpt,
                                                          const std::vector<std::string>& dirs) {
  std::vector<StripeManifest> manifests;
  std::map<std::pair<dev_t, ino_t>, std::string> seen;
  for (const std::string& dir : dirs) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0 &&
        !seen.emplace(std::pair{st.st_dev, st.st_ino}, dir).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stripe directory ", dir, " is listed twice (as ", seen[{st.st_dev, st.st_ino}], ")"));
    }
    const std::string path = io::JoinPath(dir, kStripeManifestFile);
    if (!io::FileExists(path)) continue;
    auto text = io::ReadFileToString(path);
    if (!text.ok()) return text.status();
    auto m = ParseStripeManifest(*text, path);
    if (!m.ok()) return m.status();
    if (absl::Status s = CheckAgainst(ckpt, *m); !s.ok()) return s;
    manifests.push_back(*std::move(m));
  }
  return manifests;
}

// The first, middle and last extent of each data file: the stripe's bytes against the
// manifest's CRC, then the shard's (another checkpoint of the same config has other bytes).
absl::Status CheckSample(const Checkpoint& ckpt, const StripeManifest& m) {
  std::map<std::string, std::vector<const StripeExtent*>> by_file;
  for (const StripeExtent& e : m.extents) by_file[e.path].push_back(&e);
  auto buffer = RangeBuffer();
  if (!buffer.ok()) return buffer.status();
  const auto shards = ShardsByName(ckpt);
  for (auto& [path, list] : by_file) {
    std::sort(list.begin(), list.end(),
              [](const StripeExtent* a, const StripeExtent* b) { return a->at < b->at; });
    auto file = io::RandomAccessFile::Open(path);
    if (!file.ok()) return file.status();
    size_t last = list.size();  // no index twice
    for (size_t i : {size_t{0}, list.size() / 2, list.size() - 1}) {
      if (i == last) continue;
      last = i;
      const StripeExtent& e = *list[i];
      if (absl::Status s = CheckExtent(**file, e, Whole(**buffer)); !s.ok()) return s;
      const std::string& shard_path = ckpt.shard_paths()[shards.at(e.shard)];
      auto shard = io::RandomAccessFile::Open(shard_path);
      if (!shard.ok()) return shard.status();
      auto crc = ReadRange(**shard, e.offset, e.length, Whole(**buffer));
      if (!crc.ok()) return crc.status();
      if (*crc != e.crc) {
        return absl::InvalidArgumentError(absl::StrCat(
            m.path, ": expert ", e.expert, " of layer ", e.layer, " at offset ", e.offset, " of ",
            shard_path, " has CRC-32C ", *crc, ", but was striped with ", e.crc,
            ": the stripes were made from another checkpoint of this config, or the shard has "
            "changed; re-run k3 stripe"));
      }
    }
  }
  return absl::OkStatus();
}

// ---- Writing ------------------------------------------------------------------------------

// One directory's manifest as planned: its extents in shard and offset order, each placed after
// the previous one at the next offset with the source's remainder modulo kStripeAlignment.
StripeManifest PlanDirectory(const Checkpoint& ckpt, const StripePlan& plan, int d,
                             const std::string& dir) {
  StripeManifest m;
  m.path = io::JoinPath(dir, kStripeManifestFile);
  m.fingerprint = ckpt.config().Fingerprint();
  m.directory = d;
  m.directories = plan.directories();
  m.weights = plan.weights;
  m.copies = plan.copies;
  m.layout = plan.layout;
  std::vector<std::pair<ByteSpan, std::pair<int64_t, int64_t>>> spans;
  for (int64_t l = 0; l < plan.num_layers; ++l) {
    for (int64_t e = 0; e < plan.num_experts; ++e) {
      if (!plan.Holds(d, l, e)) continue;
      ByteSpan span = ckpt.expert(l, e).spans[0];
      if (plan.layout == StripeLayout::kSlices) span = SliceOf(span, plan.weights, d);
      if (span.length > 0) spans.push_back({span, {l, e}});
    }
  }
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return std::pair(a.first.shard, a.first.offset) < std::pair(b.first.shard, b.first.offset);
  });
  const std::string data_path = io::JoinPath(dir, kStripeDataFile);
  uint64_t end = 0;
  int last_shard = -1;
  for (const auto& [span, id] : spans) {
    const std::string shard = FileName(ckpt.shard_paths()[span.shard]);
    if (span.shard != last_shard) {
      m.shards.push_back({shard, SizeOf(ckpt.shard_paths()[span.shard])});
      last_shard = span.shard;
    }
    const uint64_t at =
        end + (span.offset % kStripeAlignment + kStripeAlignment - end % kStripeAlignment) %
                  kStripeAlignment;
    m.extents.push_back({.shard = shard,
                         .offset = span.offset,
                         .length = span.length,
                         .path = data_path,
                         .at = at,
                         .layer = id.first,
                         .expert = id.second});
    end = at + span.length;
  }
  m.files.push_back({kStripeDataFile, end});
  return m;
}

// Copies the directory's extents from the shards into its data file, filling in their CRCs.
absl::Status CopyDirectory(const Checkpoint& ckpt, StripeManifest& m, PhaseProgress& progress,
                           const std::atomic<bool>& stop) {
  auto buffer = RangeBuffer();
  if (!buffer.ok()) return buffer.status();
  const auto shards = ShardsByName(ckpt);
  std::map<std::string, std::unique_ptr<io::RandomAccessFile>> sources;
  auto writer = io::SequentialWriter::Create(io::JoinPath(m.Dir(), kStripeDataFile));
  if (!writer.ok()) return writer.status();
  io::SequentialWriter& w = **writer;
  for (StripeExtent& e : m.extents) {
    if (stop) return Stopped();
    auto& source = sources[e.shard];
    if (source == nullptr) {
      auto opened = io::RandomAccessFile::Open(ckpt.shard_paths()[shards.at(e.shard)]);
      if (!opened.ok()) return opened.status();
      source = *std::move(opened);
    }
    if (absl::Status s = PadTo(w, e.at); !s.ok()) return s;
    auto crc = ReadRange(*source, e.offset, e.length, Whole(**buffer),
                         [&](std::span<const uint8_t> piece) {
                           absl::Status s = w.Append(piece);
                           progress.Add(piece.size());
                           return s;
                         });
    if (!crc.ok()) return crc.status();
    e.crc = *crc;
  }
  return w.Commit();  // fsyncs and renames the .partial file into place
}

absl::Status VerifyDirectory(const StripeManifest& m, PhaseProgress& progress,
                             const std::atomic<bool>& stop) {
  auto buffer = RangeBuffer();
  if (!buffer.ok()) return buffer.status();
  std::unique_ptr<io::RandomAccessFile> file;
  for (const StripeExtent& e : m.extents) {
    if (stop) return Stopped();
    if (file == nullptr || file->path() != e.path) {
      auto opened = io::RandomAccessFile::Open(e.path);
      if (!opened.ok()) return opened.status();
      file = *std::move(opened);
    }
    if (absl::Status s = CheckExtent(*file, e, Whole(**buffer)); !s.ok()) return s;
    progress.Add(e.length);
  }
  return absl::OkStatus();
}

// The directories must exist and be distinct (by device and inode, so a symlink or a second
// mount of one directory counts as the same).
absl::Status PrepareDirectories(const std::vector<std::string>& dirs) {
  std::map<std::pair<dev_t, ino_t>, std::string> seen;
  for (const std::string& dir : dirs) {
    if (absl::Status s = io::MakeDirectories(dir); !s.ok()) return s;
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      return absl::InternalError(absl::StrCat("reading ", dir, ": ", std::strerror(errno)));
    }
    if (!seen.emplace(std::pair{st.st_dev, st.st_ino}, dir).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stripe directory ", dir, " is listed twice (as ", seen[{st.st_dev, st.st_ino}], ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteStripes(const Checkpoint& ckpt, const StripePlan& plan,
                          const std::vector<std::string>& dirs, const StripeOptions& options) {
  const ModelConfig& c = ckpt.config();
  if (static_cast<int>(dirs.size()) != plan.directories()) {
    return absl::InvalidArgumentError(absl::StrCat("the stripe plan is for ", plan.directories(),
                                                   " directories, not ", dirs.size()));
  }
  if (plan.num_layers != c.num_layers || plan.num_experts != c.num_experts || plan.copies < 1 ||
      plan.copies > plan.directories() ||
      plan.dir.size() != static_cast<size_t>(c.num_layers * c.num_experts * plan.copies)) {
    return absl::InvalidArgumentError("the stripe plan is of another checkpoint's shape");
  }
  if (absl::Status s = PrepareDirectories(dirs); !s.ok()) return s;
  const int n = plan.directories();
  std::vector<StripeManifest> manifests;
  for (int d = 0; d < n; ++d) {
    // Without its manifest an old stripe is inert, whatever happens to its data from here on.
    if (absl::Status s = RemoveStripeFile(io::JoinPath(dirs[d], kStripeManifestFile)); !s.ok()) {
      return s;
    }
    manifests.push_back(PlanDirectory(ckpt, plan, d, dirs[d]));
  }
  auto fail = [&](const absl::Status& s) {
    for (const std::string& dir : dirs) {  // the original error matters more than these
      RemoveStripeFile(io::JoinPath(dir, kStripeManifestFile)).IgnoreError();
      RemoveStripeFile(io::JoinPath(dir, kStripeDataFile)).IgnoreError();
    }
    return s;
  };
  const uint64_t total = plan.TotalBytes();
  {
    PhaseProgress copied(options, "stripe", total);
    absl::Status s = ForEachDirectory(n, [&](int d, const std::atomic<bool>& stop) {
      return CopyDirectory(ckpt, manifests[d], copied, stop);
    });
    if (!s.ok()) return fail(s);
  }
  if (options.verify) {
    PhaseProgress verified(options, "verify", total);
    absl::Status s = ForEachDirectory(n, [&](int d, const std::atomic<bool>& stop) {
      return VerifyDirectory(manifests[d], verified, stop);
    });
    if (!s.ok()) return fail(s);
  }
  for (const StripeManifest& m : manifests) {
    // What LoadStripes will read: the text through the parser and the checks first.
    const std::string text = StripeManifestText(m);
    auto parsed = ParseStripeManifest(text, m.path);
    absl::Status s = parsed.ok() ? CheckAgainst(ckpt, *parsed) : parsed.status();
    if (s.ok()) s = io::WriteFileAtomically(m.path, text);
    if (!s.ok()) return fail(s);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StripeExtent>> LoadStripes(const Checkpoint& ckpt,
                                                      const std::vector<std::string>& dirs) {
  auto manifests = OpenManifests(ckpt, dirs);
  if (!manifests.ok()) return manifests.status();
  std::vector<StripeExtent> extents;
  for (StripeManifest& m : *manifests) {
    if (absl::Status s = CheckSample(ckpt, m); !s.ok()) return s;
    for (StripeExtent& e : m.extents) extents.push_back(std::move(e));
  }
  const auto shards = ShardsByName(ckpt);
  std::stable_sort(
      extents.begin(), extents.end(), [&](const StripeExtent& a, const StripeExtent& b) {
        return std::pair(shards.at(a.shard), a.offset) < std::pair(shards.at(b.shard), b.offset);
      });
  return extents;
}

absl::Status VerifyStripes(const Checkpoint& ckpt, const std::vector<std::string>& dirs,
                           const std::function<void(uint64_t done, uint64_t total)>& progress) {
  auto manifests = OpenManifests(ckpt, dirs);
  if (!manifests.ok()) return manifests.status();
  uint64_t total = 0;
  for (const StripeManifest& m : *manifests) {
    if (absl::Status s = CheckSample(ckpt, m); !s.ok()) return s;
    for (const StripeExtent& e : m.extents) total += e.length;
  }
  StripeOptions options;
  if (progress) {
    options.progress = [&](std::string_view, uint64_t done, uint64_t all) { progress(done, all); };
  }
  PhaseProgress verified(options, "verify", total);
  return ForEachDirectory(static_cast<int>(manifests->size()),
                          [&](int d, const std::atomic<bool>& stop) {
                            return VerifyDirectory((*manifests)[d], verified, stop);
                          });
}

}  // namespace k3
