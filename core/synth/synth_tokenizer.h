// A small byte-level BPE vocabulary in the release's tokenizer format (tiktoken.model and
// tokenizer_config.json), learned deterministically from a built-in text, for synthetic
// checkpoints.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/text/tokenizer/tokenizer.h"

namespace k3 {

struct SynthTokenizerFiles {
  std::string tiktoken_model;         // "base64 rank\n" per rank
  std::string tokenizer_config_json;  // added_tokens_decoder with the 256 reserved ids
  int64_t num_ranks = 0;
  int64_t bos_id = -1;  // -1 when the vocabulary has no room for special tokens
  int64_t eos_id = -1;
};

// vocab_size >= 512: ranks fill vocab_size - 256 ids and the top 256 ids are the reserved
// special block (K3 names at K3 offsets). 256 <= vocab_size < 512: byte tokens only.
SynthTokenizerFiles MakeSynthTokenizer(int64_t vocab_size);

// The tokenizer those files describe, read through the same parsers as a checkpoint's but from
// memory: for tests and fuzz targets that need the K3 special block and no model.
absl::StatusOr<Tokenizer> MakeSynthTokenizerInMemory(int64_t vocab_size);

}  // namespace k3
