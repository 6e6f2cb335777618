// The model's ops against the PyTorch reference on adversarial inputs (tests/reference/
// op_vectors.py computes the expected values with the reference's own functions).
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/model_ops.h"
#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/source_path.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using nlohmann::json;

class OpsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::TempDir dir;
    const std::string cmd =
        testing::ShellQuote(std::getenv("K3_PYTHON")) + " " +
        testing::ShellQuote(testing::SourcePath("tests/reference/op_vectors.py")) + " " +
        testing::ShellQuote(dir / "ops.json");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    cases_ = new json(json::parse(testing::ReadAll(dir / "ops.json")));
  }
  static void TearDownTestSuite() { delete cases_; }

  static std::vector<float> F(const json& j) { return j.get<std::vector<float>>(); }

  // Elementwise |a - b| <= rel * max|b| + abs.
  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel,
                          double abs = 0) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (float w : want) scale = std::max(scale, std::abs(double{w}));
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], rel * scale + abs) << "element " << i;
    }
  }

  static json* cases_;
};
json* OpsTest::cases_ = nullptr;

TEST_F(OpsTest, SituSaturatesAtBothCaps) {
  const json& c = (*cases_)["situ"];
  std::vector<float> gate = F(c["gate"]), up = F(c["up"]), out(gate.size()), scalar(gate.size());
  kernels::SituGlu(gate, up, out, c["beta1"], c["beta2"]);
  kernels::SituGluScalar(gate, up, scalar, c["beta1"], c["beta2"]);
  ExpectClose(out, F(c["out"]), 1e-6);
  ExpectClose(scalar, F(c["out"]), 1e-6);
  for (float v : out) EXPECT_LE(std::abs(v), 100.0f);
}

TEST_F(OpsTest, AttnResKeysAreNormalisedButTheMixIsRaw) {
  const json& c = (*cases_)["attn_res"];
  std::vector<std::vector<float>> cands;
  for (const json& v : c["candidates"]) cands.push_back(F(v));
  std::vector<const float*> ptrs;
  for (const auto& v : cands) ptrs.push_back(v.data());
  std::vector<float> fold = F(c["fold"]), out(fold.size());
  kernels::AttnResMix(ptrs, fold, c["eps"], out);
  ExpectClose(out, F(c["out"]), 1e-5);
}

TEST_F(OpsTest, ShortConvMatchesAndCarriesItsHistory) {
  const json& c = (*cases_)["short_conv"];
  const size_t steps = c["steps"], channels = c["channels"], kernel = c["kernel"];
  std::vector<float> x = F(c["x"]), w = F(c["w"]), want = F(c["out"]);
  std::vector<float> history((kernel - 1) * channels, 0.0f), all(steps * channels);
  kernels::ShortConvSilu(x, steps, channels, w, kernel, history, all);
  ExpectClose(all, want, 1e-6);
  // The same sequence one token at a time, the history carried between calls: identical bits.
  std::fill(history.begin(), history.end(), 0.0f);
  std::vector<float> one(channels);
  for (size_t t = 0; t < steps; ++t) {
    kernels::ShortConvSilu({x.data() + t * channels, channels}, 1, channels, w, kernel, history,
                           one);
    for (size_t ch = 0; ch < channels; ++ch) ASSERT_EQ(one[ch], all[t * channels + ch]);
  }
}

TEST_F(OpsTest, KdaDecayIndexesALogPerHeadAndDtBiasPerChannel) {
  const json& c = (*cases_)["kda_decay"];
  std::vector<float> alpha = F(c["z"]);
  kernels::KdaDecay(alpha, F(c["a_log"]), F(c["dt_bias"]), c["dim"], c["lower_bound"].get<float>());
  ExpectClose(alpha, F(c["alpha"]), 1e-6);
  for (float a : alpha) {
    EXPECT_GT(a, std::exp(-5.0f) * 0.999f);
    EXPECT_LE(a, 1.0f);
  }
}

TEST_F(OpsTest, KdaRecurrenceOverTenStepsWithState) {
  const json& c = (*cases_)["kda_recurrence"];
  const size_t steps = c["steps"], heads = c["heads"], dim = c["dim"];
  std::vector<float> q = F(c["q"]), k = F(c["k"]), v = F(c["v"]), beta = F(c["beta"]),
                     alpha = F(c["alpha"]), want = F(c["out"]);
  std::vector<float> state(heads * dim * dim, 0.0f), out(steps * heads * dim);
  for (size_t t = 0; t < steps; ++t) {
    for (size_t h = 0; h < heads; ++h) {
      const size_t at = (t * heads + h) * dim;
      kernels::KdaStep({state.data() + h * dim * dim, dim * dim}, dim, dim, {q.data() + at, dim},
                       {k.data() + at, dim}, {v.data() + at, dim}, {alpha.data() + at, dim},
                       beta[t * heads + h], {out.data() + at, dim});
    }
  }
  ExpectClose(out, want, 1e-5);
}

TEST_F(OpsTest, RouterBiasReordersTopKAndTiesGoToTheLowerIndex) {
  const json& c = (*cases_)["router"];
  std::vector<float> logits = F(c["logits"]), bias = F(c["bias"]);
  std::vector<kernels::RoutedExpert> routes;
  kernels::RouteTopK(logits, bias, c["top_k"], /*renormalize=*/true, 1.0f, routes);
  const auto want_experts = c["experts"].get<std::vector<int32_t>>();
  const auto want_weights = F(c["weights"]);
  ASSERT_EQ(routes.size(), want_experts.size());
  for (size_t j = 0; j < routes.size(); ++j) {
    EXPECT_EQ(routes[j].expert, want_experts[j]) << "rank " << j;
    EXPECT_NEAR(routes[j].weight, want_weights[j], 1e-6) << "rank " << j;
  }
}

}  // namespace
}  // namespace k3
