// The forward pass against the independent PyTorch reference (tests/reference/k3_reference.py)
// on several synthetic tiny models and the external fixture, plus the engine's own
// invariants: incremental decoding equals full recompute bit for bit, the thread count does not
// change a bit, and a saved and reloaded sequence state continues exactly.
#include "core/model/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint/checkpoint.h"
#include "core/synth/synth.h"
#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/source_path.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

const std::vector<int32_t> kPrompt = {3, 7, 11, 5, 9};
constexpr int kGreedyTokens = 32;
constexpr double kTolerance = 5e-4;  // of max |reference logit|, MODEL.md section 0

// A loaded model with the synchronous expert provider.
struct Engine {
  explicit Engine(const std::string& dir) {
    auto c = Checkpoint::Open(dir);
    EXPECT_TRUE(c.ok()) << c.status();
    ckpt = *std::move(c);
    auto t = LoadTrunkWeights(*ckpt);
    EXPECT_TRUE(t.ok()) << t.status();
    trunk = *std::move(t);
    provider = std::make_unique<CheckpointExpertProvider>(*ckpt);
    model = std::make_unique<Model>(ckpt->config(), *trunk, *provider);
  }
  std::vector<float> Run(std::span<const int32_t> ids, SequenceState& state, bool all = false) {
    std::vector<float> logits;
    absl::Status s = model->Forward(ids, state, all, logits);
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  }
  int64_t vocab() const { return ckpt->config().vocab_size; }

  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<TrunkWeights> trunk;
  std::unique_ptr<CheckpointExpertProvider> provider;
  std::unique_ptr<Model> model;
};

int32_t Argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Greedy decoding, incremental: prefill, then one token per step. Returns ids and the logits
// that chose each of them.
std::pair<std::vector<int32_t>, std::vector<std::vector<float>>> GreedyIncremental(Engine& e,
                                                                                   int steps) {
  SequenceState state(e.ckpt->config());
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits{e.Run(kPrompt, state)};
  for (int i = 0; i < steps; ++i) {
    ids.push_back(Argmax(logits.back()));
    if (i + 1 < steps) logits.push_back(e.Run({&ids.back(), 1}, state));
  }
  return {ids, logits};
}

struct ReferenceRun {
  std::vector<int32_t> generated;
  std::vector<float> all_logits;  // [positions, vocab]: teacher-forcing logits
};

ReferenceRun RunReference(const std::string& model_dir, int n_predict) {
  testing::TempDir out;
  std::string cmd =
      absl::StrCat(testing::ShellQuote(std::getenv("K3_PYTHON")), " ",
                   testing::ShellQuote(testing::SourcePath("tests/reference/k3_reference.py")),
                   " --model ", testing::ShellQuote(model_dir), " --ids ",
                   absl::StrJoin(kPrompt, ","), " --n-predict ", n_predict, " --dump-all-logits ",
                   out / "all.f32", " --report-json ", out / "report.json", " >/dev/null");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ReferenceRun r;
  auto report = nlohmann::json::parse(testing::ReadAll(out / "report.json"));
  r.generated = report["generated_ids"].get<std::vector<int32_t>>();
  std::string bytes = testing::ReadAll(out / "all.f32");
  r.all_logits.resize(bytes.size() / 4);
  std::memcpy(r.all_logits.data(), bytes.data(), bytes.size());
  return r;
}

// max |a - b| over max |b|, the tolerance measure of MODEL.md section 0.
double RelativeError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(double{a[i]} - b[i]));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  return diff / scale;
}

struct ModelCase {
  const char* name;
  uint64_t seed;
  std::vector<std::pair<std::string, std::string>> overrides;
  SynthFloats floats = SynthFloats::kRelease;
};
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

const ModelCase kModels[] = {
    {"top2_8experts", 1, {}},
    {"top1", 2, {{"num_experts_per_token", "1"}}},
    {"top8_64experts", 3, {{"num_experts", "64"}, {"num_experts_per_token", "8"}}},
    {"ends_mid_block", 4, {{"num_hidden_layers", "11"}, {"full_attn_layers", "4,8,11"}}},
    {"f16_storage", 5, {}, SynthFloats::kF16},
};

class SyntheticModelTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    SynthOptions opt;
    opt.out_dir = dir_.path();
    opt.seed = GetParam().seed;
    opt.overrides = GetParam().overrides;
    opt.floats = GetParam().floats;
    auto r = Synthesize(opt);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  testing::TempDir dir_;
};

TEST_P(SyntheticModelTest, MatchesTheReferenceAtEveryPositionAndGreedily) {
  Engine e(dir_.path());
  ReferenceRun ref = RunReference(dir_.path(), kGreedyTokens);
  // Greedy, incremental: the same 32 ids as the reference.
  auto [ids, step_logits] = GreedyIncremental(e, kGreedyTokens);
  EXPECT_EQ(ids, ref.generated);
  // Teacher forcing along the reference's path: every position within tolerance.
  std::vector<int32_t> sequence = kPrompt;
  sequence.insert(sequence.end(), ref.generated.begin(), ref.generated.end() - 1);
  SequenceState state(e.ckpt->config());
  std::vector<float> all = e.Run(sequence, state, /*all=*/true);
  ASSERT_EQ(all.size(), ref.all_logits.size());
  const size_t v = e.vocab();
  double worst = 0;
  for (size_t p = 0; p < sequence.size(); ++p) {
    double err = RelativeError({all.data() + p * v, v}, {ref.all_logits.data() + p * v, v});
    worst = std::max(worst, err);
    EXPECT_LE(err, kTolerance) << "position " << p;
  }
  std::printf("[ model %s ] worst relative logit error over %zu positions: %.2e\n", GetParam().name,
              sequence.size(), worst);
}

TEST_P(SyntheticModelTest, IncrementalDecodingEqualsFullRecomputeBitForBit) {
  Engine e(dir_.path());
  auto [ids, step_logits] = GreedyIncremental(e, kGreedyTokens);
  std::vector<int32_t> sequence = kPrompt;
  for (int step = 0; step < kGreedyTokens; ++step) {
    SequenceState fresh(e.ckpt->config());
    std::vector<float> full = e.Run(sequence, fresh);  // the whole prefix from scratch
    ASSERT_EQ(full, step_logits[step]) << "step " << step;
    sequence.push_back(ids[step]);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, SyntheticModelTest, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string(info.param.name); });

std::string FixtureDir() { return testing::SharedDir() + "/fixtures/reference-tiny"; }

TEST(FixtureModelTest, ReproducesTheExternalLogitsAndGreedyIds) {
  Engine e(FixtureDir());
  auto ref = nlohmann::json::parse(testing::ReadAll(FixtureDir() + "/ref_logits.json"));
  std::vector<float> expected;
  for (uint32_t bits : ref["logits_bits"].get<std::vector<uint32_t>>()) {
    expected.push_back(std::bit_cast<float>(bits));
  }
  SequenceState state(e.ckpt->config());
  std::vector<float> logits = e.Run(kPrompt, state);
  double err = RelativeError(logits, expected);
  EXPECT_LE(err, kTolerance);
  std::printf("[ fixture ] relative logit error %.2e (tolerance %.0e)\n", err, kTolerance);
  auto [ids, unused] = GreedyIncremental(e, 8);
  EXPECT_EQ(ids, (std::vector<int32_t>{92, 168, 13, 3, 49, 208, 214, 208}));
}

TEST(FixtureModelTest, MatchesTheReferenceFor32Tokens) {
  Engine e(FixtureDir());
  ReferenceRun ref = RunReference(FixtureDir(), kGreedyTokens);
  auto [ids, unused] = GreedyIncremental(e, kGreedyTokens);
  EXPECT_EQ(ids, ref.generated);
}

TEST(FixtureModelTest, OneAndTwoThreadsGiveTheSameBits) {
  Engine e(FixtureDir());
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2}) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    auto [ids, logits] = GreedyIncremental(e, 8);
    std::vector<float> flat;
    for (const auto& l : logits) flat.insert(flat.end(), l.begin(), l.end());
    runs.push_back(flat);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(FixtureModelTest, SavedStateContinuesExactly) {
  Engine e(FixtureDir());
  testing::TempDir dir;
  const std::vector<int32_t> more = {17, 4, 200, 31, 8, 99};
  // Uninterrupted.
  SequenceState a(e.ckpt->config());
  e.Run(kPrompt, a);
  std::vector<float> expected = e.Run(more, a, /*all=*/true);
  // Interrupted: save after the prompt, load into a fresh state, continue.
  SequenceState b(e.ckpt->config());
  e.Run(kPrompt, b);
  ASSERT_TRUE(b.Save(dir / "state.bin").ok());
  auto loaded = SequenceState::Load(dir / "state.bin", e.ckpt->config());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tokens(), kPrompt);
  std::vector<float> got = e.Run(more, *loaded, /*all=*/true);
  EXPECT_EQ(got, expected);
}

TEST(FixtureModelTest, StateOfAnotherModelIsRefused) {
  Engine e(FixtureDir());
  testing::TempDir dir;
  SequenceState s(e.ckpt->config());
  e.Run(kPrompt, s);
  ASSERT_TRUE(s.Save(dir / "state.bin").ok());
  auto other = ApplyConfigOverrides(e.ckpt->config(), {{"rms_norm_eps", "1e-6"}});
  ASSERT_TRUE(other.ok());
  auto loaded = SequenceState::Load(dir / "state.bin", *other);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()), ::testing::HasSubstr("different model"));
  // A truncated file is refused too, naming the file.
  std::string bytes = testing::ReadAll(dir / "state.bin");
  std::ofstream(dir / "cut.bin", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto cut = SequenceState::Load(dir / "cut.bin", e.ckpt->config());
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(std::string(cut.status().message()), ::testing::HasSubstr(dir / "cut.bin"));
}

TEST(FixtureModelTest, TokenOutsideTheVocabularyIsAnInputError) {
  Engine e(FixtureDir());
  SequenceState s(e.ckpt->config());
  std::vector<float> logits;
  std::vector<int32_t> ids = {3, 256};
  absl::Status st = e.model->Forward(ids, s, false, logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("token id 256 at position 1"));
}

}  // namespace
}  // namespace k3
