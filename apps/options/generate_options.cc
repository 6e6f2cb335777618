#include "apps/options/generate_options.h"

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "apps/options/flags.h"
#include "io/file.h"

namespace k3::cli {

absl::StatusOr<std::optional<Tokenizer>> FindTokenizer(const std::string& model_dir,
                                                       bool required) {
  std::string dir = absl::GetFlag(FLAGS_tokenizer);
  if (dir.empty()) dir = model_dir;
  if (io::FileExists(dir + "/tiktoken.model")) {
    auto tok = Tokenizer::Load(dir);
    if (!tok.ok()) return tok.status();
    return std::optional<Tokenizer>(*std::move(tok));
  }
  if (required || !absl::GetFlag(FLAGS_tokenizer).empty()) {
    return absl::NotFoundError(absl::StrCat("no tokenizer: ", dir,
                                            "/tiktoken.model does not exist (use --ids, or "
                                            "--tokenizer DIR)"));
  }
  return std::optional<Tokenizer>();
}

absl::StatusOr<std::vector<int32_t>> StopIds(const ModelConfig& c,
                                             const std::optional<Tokenizer>& tokenizer) {
  std::vector<int32_t> stops;
  if (absl::GetFlag(FLAGS_ignore_eos)) {
    if (!absl::GetFlag(FLAGS_stop_id).empty()) {
      return absl::InvalidArgumentError("--ignore-eos and --stop-id exclude each other");
    }
    return stops;
  }
  for (const std::string& s : absl::GetFlag(FLAGS_stop_id)) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(s, &id) || id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stop-id ", s, ": not a token id below ", c.vocab_size));
    }
    stops.push_back(id);
  }
  if (!absl::GetFlag(FLAGS_stop_id).empty()) return stops;
  // Default (MODEL.md 0 Q12): [EOS] and <|end_of_msg|>, by name when the tokenizer has them.
  for (const char* name : {"[EOS]", "<|end_of_msg|>"}) {
    if (tokenizer.has_value()) {
      if (auto id = tokenizer->SpecialTokenId(name); id && *id < c.vocab_size) stops.push_back(*id);
    }
  }
  if (stops.empty()) {
    for (int32_t id : {163585, 163586}) {
      if (id < c.vocab_size) stops.push_back(id);
    }
  }
  return stops;
}

absl::StatusOr<SamplerOptions> ReadSampler() {
  SamplerOptions s;
  s.temperature = absl::GetFlag(FLAGS_temp);
  s.greedy = absl::GetFlag(FLAGS_greedy) || s.temperature == 0;
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.top_p = absl::GetFlag(FLAGS_top_p);
  s.seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_greedy) && s.temperature != 0) {
    return absl::InvalidArgumentError("--greedy and --temp exclude each other");
  }
  if (absl::Status st = ValidateSamplerOptions(s); !st.ok()) return st;
  return s;
}

}  // namespace k3::cli
