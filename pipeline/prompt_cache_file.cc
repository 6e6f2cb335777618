#include "pipeline/prompt_cache_file.h"

#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // AVX2 or AVX-512 picked at run time: the baseline is disk speed
#endif

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/safetensors.h"

namespace k3 {
namespace {

// The file format and the key are defined on little-endian bytes, the host's.
static_assert(std::endian::native == std::endian::little);

// The fixed part of a header: magic, version, fingerprint length.
constexpr uint64_t kFixedHeaderBytes = 16;
// A sample of the tensor bytes at each end of a shard's data section.
constexpr uint64_t kSampleBytes = 4096;
// Writes are gathered into pieces of this size (a state hands out many 8-byte lengths).
constexpr size_t kWriteChunkBytes = 1 << 20;

struct Xxh3StateFree {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using Xxh3State = std::unique_ptr<XXH3_state_t, Xxh3StateFree>;

Xxh3State NewXxh3State() { return Xxh3State(XXH3_createState()); }

std::string Hex128(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : c.digest) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 15]);
  }
  return hex;
}

template <typename T>
void Append(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T LoadAt(std::string_view bytes, uint64_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

absl::Status BadFile(std::string_view what) { return absl::DataLossError(std::string(what)); }

// The header of a state's file, its checksum field included.
std::string EncodeHeader(std::string_view fingerprint, std::span<const int32_t> tokens,
                         uint64_t payload_bytes) {
  std::string h(kPromptCacheMagic, 8);
  Append(h, kPromptCacheVersion);
  Append(h, static_cast<uint32_t>(fingerprint.size()));
  h.append(fingerprint);
  Append(h, static_cast<uint64_t>(tokens.size()));
  h.append(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  Append(h, payload_bytes);
  Append(h, static_cast<uint64_t>(XXH3_64bits(h.data(), h.size())));
  return h;
}

// The length of the header that `prefix` (the file's first bytes, at least the fixed part and
// the fingerprint where the file has them) starts, after checking what the prefix holds.
absl::StatusOr<uint64_t> HeaderLength(std::string_view prefix, uint64_t file_size,
                                      std::string_view fingerprint) {
  if (file_size < kFixedHeaderBytes) {
    return BadFile(absl::StrCat("truncated: ", file_size, " bytes, shorter than any header"));
  }
  if (std::memcmp(prefix.data(), kPromptCacheMagic, 8) != 0) {
    return BadFile("not a k3 prompt cache file (its magic is wrong)");
  }
  const auto version = LoadAt<uint32_t>(prefix, 8);
  if (version != kPromptCacheVersion) {
    return BadFile(
        absl::StrCat("format version ", version, ", this k3 reads version ", kPromptCacheVersion));
  }
  const auto f = LoadAt<uint32_t>(prefix, 12);
  if (f == 0 || f > kMaxPromptCacheFingerprint) {
    return BadFile(absl::StrCat("fingerprint length ", f, " is impossible"));
  }
  if (file_size < kFixedHeaderBytes + f + 8) {
    return BadFile(absl::StrCat("truncated in its header: ", file_size, " bytes"));
  }
  const std::string_view theirs = prefix.substr(kFixedHeaderBytes, f);
  if (theirs != fingerprint) {
    return BadFile(absl::StrCat("written for another checkpoint (fingerprint ", std::string(theirs),
                                ", this cache's is ", std::string(fingerprint), ")"));
  }
  const auto position = LoadAt<uint64_t>(prefix, kFixedHeaderBytes + f);
  const uint64_t before_tokens = kFixedHeaderBytes + f + 8;
  // Checked against the file before it is multiplied: a wild count must not wrap or allocate.
  if (position > (file_size - before_tokens) / 4 || file_size - before_tokens - position * 4 < 16) {
    return BadFile(
        absl::StrCat("truncated in its header: ", file_size, " bytes, for ", position, " tokens"));
  }
  return before_tokens + position * 4 + 16;
}

// Checks a whole header (HeaderLength() bytes) of a file of `file_size` bytes.
absl::StatusOr<PromptCacheHeader> ParseHeader(std::string_view header, uint64_t file_size) {
  const uint64_t sum_at = header.size() - 8;
  if (LoadAt<uint64_t>(header, sum_at) != XXH3_64bits(header.data(), sum_at)) {
    return BadFile("the header's checksum does not match (a damaged header)");
  }
  PromptCacheHeader h;
  h.header_bytes = header.size();
  h.payload_bytes = LoadAt<uint64_t>(header, sum_at - 8);
  const uint64_t f = LoadAt<uint32_t>(header, 12);
  h.tokens.resize(LoadAt<uint64_t>(header, kFixedHeaderBytes + f));
  std::memcpy(h.tokens.data(), header.data() + kFixedHeaderBytes + f + 8, h.tokens.size() * 4);
  if (h.payload_bytes > file_size || file_size != h.file_bytes()) {
    return BadFile(absl::StrCat("truncated or extended: ", file_size, " bytes, its header says ",
                                h.header_bytes, " + ", h.payload_bytes, " + 8"));
  }
  return h;
}

absl::StatusOr<std::string> ReadBytes(const io::RandomAccessFile& file, uint64_t offset,
                                      uint64_t length) {
  std::string out(length, '\0');
  absl::Status s = file.ReadAt(offset, {reinterpret_cast<uint8_t*>(out.data()), out.size()});
  if (!s.ok()) return s;
  return out;
}

// Gathers the pieces of a file into large writes, hashing them on the way.
class ChunkedWriter {
 public:
  ChunkedWriter(int fd, const std::string& path, const std::function<int(uint64_t)>& fault)
      : fd_(fd), path_(path), fault_(fault), hash_(NewXxh3State()) {
    XXH3_64bits_reset(hash_.get());
  }
  void Add(std::string_view piece) {
    if (!status_.ok()) return;
    XXH3_64bits_update(hash_.get(), piece.data(), piece.size());
    if (buffer_.size() + piece.size() > kWriteChunkBytes) Flush();
    if (piece.size() >= kWriteChunkBytes) {
      WriteOut(piece);
    } else {
      buffer_.append(piece);
    }
  }
  // Writes what is gathered and the checksum of everything added.
  absl::Status Finish() {
    const uint64_t sum = XXH3_64bits_digest(hash_.get());
    buffer_.append(reinterpret_cast<const char*>(&sum), 8);
    Flush();
    return status_;
  }

 private:
  void Flush() {
    WriteOut(buffer_);
    buffer_.clear();
  }
  void WriteOut(std::string_view bytes) {
    while (status_.ok() && !bytes.empty()) {
      int error = fault_ ? fault_(offset_) : 0;
      ssize_t n = -1;
      if (error == 0) {
        n = ::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset_));
        if (n < 0) error = errno;
      }
      if (error == EINTR) continue;
      if (error != 0) {
        status_ = absl::InternalError(
            absl::StrCat("writing ", path_, " at offset ", offset_, ": ", std::strerror(error)));
        return;
      }
      bytes.remove_prefix(static_cast<size_t>(n));
      offset_ += static_cast<uint64_t>(n);
    }
  }

  int fd_;
  const std::string& path_;
  const std::function<int(uint64_t)>& fault_;
  Xxh3State hash_;
  std::string buffer_;
  uint64_t offset_ = 0;
  absl::Status status_;
};

// Feeds a file's identity to `hash`: its name, size and safetensors header, and the first and
// last kSampleBytes of its data (where other weights of the same shapes show).
absl::Status HashShard(const std::string& path, XXH3_state_t* hash) {
  auto file = io::RandomAccessFile::Open(path);
  if (!file.ok()) return file.status();
  const uint64_t size = (*file)->size();
  const std::string name = path.substr(path.rfind('/') + 1);
  uint8_t prefix[8] = {};
  if (absl::Status s = (*file)->ReadAt(0, prefix); !s.ok()) return s;
  auto header_bytes = ParseHeaderLength(prefix, size, path);
  if (!header_bytes.ok()) return header_bytes.status();
  const uint64_t data = 8 + *header_bytes;
  const uint64_t sample = std::min(kSampleBytes, size - data);
  std::string fields = name;
  fields.push_back('\0');
  Append(fields, size);
  for (uint64_t offset : {uint64_t{0}, data, size - sample}) {
    const uint64_t length = offset == 0 ? data : sample;
    auto bytes = ReadBytes(**file, offset, length);
    if (!bytes.ok()) return bytes.status();
    fields += *bytes;
  }
  XXH3_128bits_update(hash, fields.data(), fields.size());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> PromptCacheFingerprint(const Checkpoint& ckpt) {
  Xxh3State hash = NewXxh3State();
  XXH3_128bits_reset(hash.get());
  std::string fields = absl::StrCat("k3 prompt cache v", kPromptCacheVersion, "\nconfig ",
                                    ckpt.config().Fingerprint(), "\nstate f32\n");
  XXH3_128bits_update(hash.get(), fields.data(), fields.size());
  for (const std::string& shard : ckpt.shard_paths()) {
    if (absl::Status s = HashShard(shard, hash.get()); !s.ok()) return s;
  }
  // The tokenizer does not change a state for given ids, but a state is looked up by the ids
  // of a rendered prompt: other files give other ids for the same conversation.
  for (const char* name : {"tiktoken.model", "tokenizer_config.json"}) {
    const std::string path = io::JoinPath(ckpt.dir(), name);
    if (!io::FileExists(path)) continue;
    auto text = io::ReadFileToString(path);
    if (!text.ok()) return text.status();
    const std::string head = absl::StrCat(name, " ", text->size(), "\n");
    XXH3_128bits_update(hash.get(), head.data(), head.size());
    XXH3_128bits_update(hash.get(), text->data(), text->size());
  }
  return Hex128(XXH3_128bits_digest(hash.get()));
}

std::string PromptCacheKey(std::string_view fingerprint, std::span<const int32_t> tokens) {
  XXH128_hash_t h = XXH3_128bits(fingerprint.data(), fingerprint.size());
  std::string block;
  for (size_t at = 0; at < tokens.size(); at += kPromptCacheBlockTokens) {
    const auto part = tokens.subspan(at, std::min(kPromptCacheBlockTokens, tokens.size() - at));
    XXH128_canonical_t previous;
    XXH128_canonicalFromHash(&previous, h);
    block.assign(reinterpret_cast<const char*>(previous.digest), sizeof previous.digest);
    block.append(reinterpret_cast<const char*>(part.data()), part.size_bytes());
    h = XXH3_128bits(block.data(), block.size());
  }
  return Hex128(h);
}

uint64_t PromptCacheFileBytes(std::string_view fingerprint, const SequenceState& state) {
  return 40 + fingerprint.size() + state.tokens().size() * 4 + state.SerializedBytes() + 8;
}

absl::StatusOr<PromptCacheHeader> ReadPromptCacheHeader(const io::RandomAccessFile& file,
                                                        std::string_view fingerprint) {
  // Most headers (2,048 tokens: 8 KiB) fit in the first read.
  const uint64_t size = file.size();
  auto prefix = ReadBytes(file, 0, std::min<uint64_t>(size, 16 << 10));
  if (!prefix.ok()) return prefix.status();
  auto length = HeaderLength(*prefix, size, fingerprint);
  if (!length.ok()) return length.status();
  if (*length > prefix->size()) {
    prefix = ReadBytes(file, 0, *length);
    if (!prefix.ok()) return prefix.status();
  }
  return ParseHeader(std::string_view(*prefix).substr(0, *length), size);
}

absl::Status WritePromptCacheFile(int fd, const std::string& path, std::string_view fingerprint,
                                  const SequenceState& state,
                                  const std::function<int(uint64_t)>& fault) {
  ChunkedWriter w(fd, path, fault);
  w.Add(EncodeHeader(fingerprint, state.tokens(), state.SerializedBytes()));
  state.SerializeTo([&](std::string_view piece) { w.Add(piece); });
  if (absl::Status s = w.Finish(); !s.ok()) return s;
  if (::fsync(fd) != 0) {
    return absl::InternalError(absl::StrCat("syncing ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<SequenceState> ReadPromptCacheFile(const io::RandomAccessFile& file,
                                                  std::string_view fingerprint,
                                                  std::span<const int32_t> tokens,
                                                  const ModelConfig& config) {
  // One read of the whole file, not a mapping: a mapped file that another program truncates,
  // or a disk that fails, is a SIGBUS, and the cache must not take the process down.
  auto bytes = ReadBytes(file, 0, file.size());
  if (!bytes.ok()) return bytes.status();
  const std::string_view all = *bytes;
  auto length = HeaderLength(all, all.size(), fingerprint);
  if (!length.ok()) return length.status();
  auto header = ParseHeader(all.substr(0, *length), all.size());
  if (!header.ok()) return header.status();
  if (!std::equal(header->tokens.begin(), header->tokens.end(), tokens.begin(), tokens.end())) {
    return BadFile("holds other tokens than its name says (a hash collision or a renamed file)");
  }
  const uint64_t sum_at = header->header_bytes + header->payload_bytes;
  if (LoadAt<uint64_t>(all, sum_at) != XXH3_64bits(all.data(), sum_at)) {
    return BadFile("the checksum does not match (damaged data)");
  }
  auto state = SequenceState::Deserialize(all.substr(header->header_bytes, header->payload_bytes),
                                          config, "its payload");
  if (!state.ok()) return BadFile(std::string(state.status().message()));
  if (!std::equal(state->tokens().begin(), state->tokens().end(), tokens.begin(), tokens.end())) {
    return BadFile("its payload holds other tokens than its header");
  }
  return state;
}

}  // namespace k3
