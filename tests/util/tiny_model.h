// The options that synthesise the `tiny` checkpoint (the shape of
// ../shared/fixtures/reference-tiny) into a test's directory; tests adjust seed or skew.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/synth.h"
#include "tests/util/temp_dir.h"

namespace k3::testing {

inline SynthOptions TinyModel(const std::string& out_dir) {
  SynthOptions o;
  o.preset = "tiny";
  o.out_dir = out_dir;
  return o;
}

// A suite's own tiny checkpoint (router skew 1: every expert of a layer in use), written once
// for the suite into a temp dir: ModelDir().
class TinyModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    SynthOptions opt = TinyModel(dir_->path() + "/tiny");
    opt.router_skew = 1.0;
    ASSERT_TRUE(Synthesize(opt).ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string ModelDir() { return dir_->path() + "/tiny"; }
  static inline TempDir* dir_ = nullptr;
};

inline bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace k3::testing
