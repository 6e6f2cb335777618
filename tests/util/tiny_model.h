// The options that synthesise the `tiny` checkpoint (the shape of
// ../shared/fixtures/reference-tiny) into a test's directory; tests adjust seed or skew.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/model/model.h"
#include "core/synth/synth.h"
#include "tests/util/model_cache.h"
#include "tests/util/temp_dir.h"

namespace k3::testing {

inline SynthOptions TinyModel(const std::string& out_dir) {
  SynthOptions o;
  o.preset = "tiny";
  o.out_dir = out_dir;
  return o;
}

// Synthesize(options) with the test binary's own synth code, shared: `link` points to it.
// `what` names the options (the out_dir is replaced).
inline bool LinkSynthModel(const std::string& link, const std::string& what, SynthOptions options) {
  return LinkSharedModel(link, "Synthesize " + what, "/proc/self/exe", [&](const std::string& out) {
    options.out_dir = out;
    const auto r = Synthesize(options);
    EXPECT_TRUE(r.ok()) << what << ": " << r.status();
    return r.ok();
  });
}

// A suite's tiny checkpoint (router skew 1: every expert of a layer in use), shared by the test
// processes of the build (tests/util/model_cache.h) and linked into the suite's temp dir:
// ModelDir(). The suite's tests only read it.
class TinyModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    SynthOptions opt = TinyModel("");
    opt.router_skew = 1.0;
    ASSERT_TRUE(LinkSynthModel(ModelDir(), "tiny, router skew 1", opt));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string ModelDir() { return dir_->path() + "/tiny"; }
  static inline TempDir* dir_ = nullptr;
};

// The tiny model opened in memory for each test: its checkpoint, its whole trunk, its experts read
// straight from the checkpoint, and a Model over them.
class TinyModelInMemorySuite : public TinyModelSuite {
 protected:
  void SetUp() override {
    auto c = Checkpoint::Open(ModelDir());
    ASSERT_TRUE(c.ok()) << c.status();
    ckpt_ = *std::move(c);
    auto t = LoadTrunkWeights(*ckpt_);
    ASSERT_TRUE(t.ok()) << t.status();
    trunk_ = *std::move(t);
    provider_ = std::make_unique<CheckpointExpertProvider>(*ckpt_);
    model_ = std::make_unique<Model>(ckpt_->config(), *trunk_, *provider_);
  }

  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<TrunkWeights> trunk_;
  std::unique_ptr<CheckpointExpertProvider> provider_;
  std::unique_ptr<Model> model_;
};

inline bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace k3::testing
