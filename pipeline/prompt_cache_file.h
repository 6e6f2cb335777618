// One file of the prompt cache (pipeline/prompt_cache.h), and the fingerprint and key that name
// it. The file: a whole sequence state with the tokens it follows, checked end to end. Format
// version 1, integers little-endian:
//
//   offset   bytes  field
//   0        8      magic "K3PCACHE"
//   8        4      format version (u32): kPromptCacheVersion
//   12       4      fingerprint length F (u32, 1..kMaxPromptCacheFingerprint)
//   16       F      fingerprint (PromptCacheFingerprint: 32 hex digits)
//   16+F     8      position P: the number of tokens (u64)
//   24+F     4P     the token ids (i32)
//   24+F+4P  8      payload length L (u64)
//   32+F+4P  8      XXH3-64 of the header's bytes before this field
//   H        L      payload: SequenceState::Serialize() (its own magic, version, config
//                   fingerprint, tokens and every array with its length), H = 40+F+4P
//   H+L      8      XXH3-64 of bytes [0, H+L)
//
// The header has a checksum of its own so that the index, rebuilt from headers alone at start,
// holds only tokens that were written. The file is named PromptCacheKey(fingerprint, tokens)
// + kPromptCacheSuffix, and the tokens are compared on load: a collision of the key, or a file
// renamed by hand, reads as damaged, never as another prefix's state.
//
// A change of the layout, or of the arithmetic so that a state differs from a cold prefill's,
// takes a new version: files of another version are refused (their directory is another).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/config.h"
#include "core/model/sequence_state.h"
#include "io/file.h"

namespace k3 {

inline constexpr uint32_t kPromptCacheVersion = 1;
inline constexpr char kPromptCacheMagic[8] = {'K', '3', 'P', 'C', 'A', 'C', 'H', 'E'};
inline constexpr size_t kPromptCacheBlockTokens = 256;  // of the key's hash chain
inline constexpr uint32_t kMaxPromptCacheFingerprint = 256;
inline constexpr char kPromptCacheSuffix[] = ".k3pc";
// A file moved aside is renamed to its name plus this; eviction removes these first.
inline constexpr char kPromptCacheBadSuffix[] = ".bad";
// A file being written is named <name>.tmp.<pid>.<n> and flock'd by its writer until renamed.
inline constexpr char kPromptCacheTempInfix[] = ".tmp.";

// What a cache file's header says.
struct PromptCacheHeader {
  std::vector<int32_t> tokens;
  uint64_t header_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t file_bytes() const { return header_bytes + payload_bytes + 8; }
};

// What identifies the states a checkpoint produces, as 32 hex digits (XXH3-128): the config's
// Fingerprint(), each shard's file name, size and safetensors header, 4 KiB of tensor bytes at
// each end of its data section (two checkpoints of one config with other weights differ there),
// the tokenizer files, the state's dtype and kPromptCacheVersion. Reads only those bytes.
absl::StatusOr<std::string> PromptCacheFingerprint(const Checkpoint& ckpt);

// The name (without the suffix) of the file that holds the state after `tokens`: 32 hex digits
// of a seedless hash chain, h0 = XXH3-128(fingerprint), h_i = XXH3-128(h_{i-1}, block i), over
// blocks of kPromptCacheBlockTokens tokens, the last one partial. The same in every process.
std::string PromptCacheKey(std::string_view fingerprint, std::span<const int32_t> tokens);

// The bytes of the cache file of `state`.
uint64_t PromptCacheFileBytes(std::string_view fingerprint, const SequenceState& state);

// Reads and checks the header of a cache file: magic, version, fingerprint, the header's own
// checksum, and that the file is as long as the header says. DataLoss saying what is wrong;
// the caller names the file. Reads only the header.
absl::StatusOr<PromptCacheHeader> ReadPromptCacheHeader(const io::RandomAccessFile& file,
                                                        std::string_view fingerprint);

// Writes the cache file of `state` into `fd`, a new and empty file, and fsyncs it. An error
// names `path` and the offset. `fault` (tests, may be empty) is called before each write with
// its offset; an errno it returns fails that write.
absl::Status WritePromptCacheFile(int fd, const std::string& path, std::string_view fingerprint,
                                  const SequenceState& state,
                                  const std::function<int(uint64_t)>& fault);

// Reads a whole cache file and checks everything: the header as above, its tokens equal to
// `tokens`, the checksum over header and payload, and the payload as a state of `config` that
// holds the same tokens. DataLoss saying what is wrong.
absl::StatusOr<SequenceState> ReadPromptCacheFile(const io::RandomAccessFile& file,
                                                  std::string_view fingerprint,
                                                  std::span<const int32_t> tokens,
                                                  const ModelConfig& config);

}  // namespace k3
