// Encode and decode throughput on a mixed corpus: the parity corpus (English, code, JSON, CJK,
// emoji, many scripts, whitespace) repeated to about 1 MB; its long runs separately.
//
//   k3_tokenizer_bench                          # vocabulary learned from the corpus
//   K3_TIKTOKEN_MODEL=dir/tiktoken.model k3_tokenizer_bench   # e.g. o200k_base (200k ranks)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/text/tokenizer/pretokenizer.h"
#include "core/text/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/test_vocab.h"

namespace k3 {
namespace {

// The parity corpus's strings, those longer than 1,000 bytes (deliberate long runs) only when
// `long_runs`, joined by newlines and repeated to about 1 MB.
std::string MixedCorpus(bool long_runs) {
  std::ifstream in(std::string(K3_TOKENIZER_TEST_DIR) + "/parity_corpus.json");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const nlohmann::json corpus = nlohmann::json::parse(buffer.str());
  std::string text;
  for (const auto& s : corpus.at("strings")) {
    const std::string str = s.get<std::string>();
    if ((str.size() > 1000) != long_runs) continue;
    text += str;
    text += "\n";
  }
  const std::string once = text;
  while (text.size() < (1 << 20)) text += once;
  return text;
}

const std::string& Corpus() {
  static const std::string* corpus = new std::string(MixedCorpus(false));
  return *corpus;
}

const std::string& LongRuns() {
  static const std::string* corpus = new std::string(MixedCorpus(true));
  return *corpus;
}

Tokenizer MakeTokenizer() {
  if (const char* model = std::getenv("K3_TIKTOKEN_MODEL"); model != nullptr && *model) {
    const char* config = std::getenv("K3_TIKTOKEN_CONFIG");
    absl::StatusOr<Tokenizer> tok = Tokenizer::LoadFiles(model, config ? config : "");
    if (!tok.ok()) {
      std::cerr << tok.status() << "\n";
      std::exit(1);
    }
    std::cerr << "vocabulary: " << model << " (" << tok->num_base_tokens() << " ranks)\n";
    return *std::move(tok);
  }
  // Learn merges on the corpus's own pieces, as a BPE trainer would.
  absl::StatusOr<tokenizer_internal::PreTokenizer> pretokenizer =
      tokenizer_internal::PreTokenizer::Create(kKimiPatStr);
  std::vector<std::string_view> views;
  pretokenizer->Split(std::string_view(Corpus()).substr(0, 100'000), &views);
  const std::vector<std::string> merges =
      tokenizer_testing::TrainMerges(std::vector<std::string>(views.begin(), views.end()), 6000);
  const std::vector<std::string> vocab = tokenizer_testing::MakeVocab(merges, 0);
  std::vector<std::pair<std::string, TokenId>> ranks;
  for (size_t i = 0; i < vocab.size(); ++i) ranks.emplace_back(vocab[i], static_cast<TokenId>(i));
  absl::StatusOr<Tokenizer> tok =
      Tokenizer::Create(std::move(ranks), tokenizer_testing::K3SpecialTokens());
  std::cerr << "vocabulary: generated, " << vocab.size() << " ranks\n";
  return *std::move(tok);
}

const Tokenizer& Tok() {
  static const Tokenizer* tok = new Tokenizer(MakeTokenizer());
  return *tok;
}

void BM_Encode(benchmark::State& state) {
  const std::string& text = Corpus();
  const bool allow_special = state.range(0) != 0;
  Tok();  // build the vocabulary outside the timed loop
  size_t tokens = 0;
  for (auto _ : state) {
    std::vector<TokenId> ids = Tok().Encode(text, allow_special);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["bytes/token"] = static_cast<double>(text.size()) / static_cast<double>(tokens);
}
BENCHMARK(BM_Encode)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Runs of thousands of letters, digits, Han, emoji, marks, punctuation: long pieces.
void BM_EncodeLongRuns(benchmark::State& state) {
  const std::string& text = LongRuns();
  Tok();
  for (auto _ : state) benchmark::DoNotOptimize(Tok().Encode(text, false).data());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_EncodeLongRuns)->Unit(benchmark::kMillisecond);

// The regex alone, to see its share of Encode.
void BM_PreTokenize(benchmark::State& state) {
  static const auto* pretokenizer =
      new tokenizer_internal::PreTokenizer(*tokenizer_internal::PreTokenizer::Create(kKimiPatStr));
  const std::string& text = Corpus();
  std::vector<std::string_view> pieces;
  for (auto _ : state) {
    pieces.clear();
    pretokenizer->Split(text, &pieces);
    benchmark::DoNotOptimize(pieces.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_PreTokenize)->Unit(benchmark::kMillisecond);

// One 100 KB run without spaces: a long piece for the BPE.
void BM_EncodeLongPiece(benchmark::State& state) {
  std::string text;
  for (int i = 0; text.size() < 100'000; ++i) text += "abcdefghijklmnopqrstuvwxyz"[i * 7 % 26];
  Tok();
  for (auto _ : state) benchmark::DoNotOptimize(Tok().Encode(text, false).data());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_EncodeLongPiece)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const std::vector<TokenId> ids = Tok().Encode(Corpus(), false);
  for (auto _ : state) benchmark::DoNotOptimize(Tok().Decode(ids)->data());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * Corpus().size()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace k3

BENCHMARK_MAIN();
