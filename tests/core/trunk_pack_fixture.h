// The fixture of the trunk pack suites: one tiny checkpoint, a pack directory per test, and
// helpers to edit the manifest and read the error a damaged pack gives.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "core/checkpoint/checkpoint.h"
#include "core/synth/synth.h"
#include "core/checkpoint/trunk_pack.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {

using ojson = nlohmann::ordered_json;

// One tiny checkpoint for the whole suite (synthesis is the slow part); each test packs it
// into its own directory.
class TrunkPackTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new testing::TempDir();
    SynthOptions opt = testing::TinyModel(model_->path());
    opt.seed = 11;
    auto r = Synthesize(opt);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  void SetUp() override {
    auto ckpt = Checkpoint::Open(model_->path());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
  }

  void Pack(const PackOptions& options = {}) {
    auto r = WriteTrunkPack(*ckpt_, out(), options);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  std::string out() const { return out_ / "pack"; }
  std::string Manifest() const { return out() + "/trunk.json"; }
  std::string PackFile() const { return out() + "/trunk.pack"; }

  void EditManifest(const std::function<void(ojson&)>& edit) {
    auto text = io::ReadFileToString(Manifest());
    ASSERT_TRUE(text.ok()) << text.status();
    ojson j = ojson::parse(*text);
    edit(j);
    ASSERT_TRUE(io::WriteFileAtomically(Manifest(), j.dump(1)).ok());
  }

  // Opens the (damaged) pack: must fail; returns the message.
  std::string OpenError(absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    auto pack = TrunkPack::Open(out(), *ckpt_);
    EXPECT_FALSE(pack.ok()) << "a damaged pack opened";
    if (pack.ok()) return "";
    EXPECT_EQ(pack.status().code(), code) << pack.status();
    return std::string(pack.status().message());
  }

  // The index in runs[] of the run of `layer` (-1: globals).
  static size_t RunIndex(const ojson& j, int64_t layer) {
    for (size_t i = 0; i < j["runs"].size(); ++i) {
      const ojson& l = j["runs"][i]["layer"];
      if (layer < 0 ? l.is_string() : (l.is_number() && l.get<int64_t>() == layer)) return i;
    }
    ADD_FAILURE() << "no run for layer " << layer;
    return 0;
  }

  static inline testing::TempDir* model_ = nullptr;
  std::unique_ptr<Checkpoint> ckpt_;
  testing::TempDir out_;
};

}  // namespace k3
