#include "core/checkpoint/trunk_pack.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "core/synth/synth.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "tests/core/trunk_pack_fixture.h"

namespace k3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ojson = nlohmann::ordered_json;

TEST(Crc32cTest, KnownAnswersAndIncrementalUse) {
  const std::string text = "123456789";
  EXPECT_EQ(Crc32c(0, text.data(), text.size()), 0xE3069283u);
  EXPECT_EQ(Crc32c(Crc32c(0, text.data(), 4), text.data() + 4, 5), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, nullptr, 0), 0u);
}

TEST_F(TrunkPackTest, EveryTrunkTensorIsInThePackWithTheCheckpointsBytes) {
  Pack();
  auto pack = TrunkPack::Open(out(), *ckpt_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  auto file = io::RandomAccessFile::Open((*pack)->pack_path());
  ASSERT_TRUE(file.ok());
  const auto specs = TrunkTensorSpecs(ckpt_->config(), ckpt_->names());
  EXPECT_EQ((*pack)->tensor_count(), static_cast<int64_t>(specs.size()));
  for (const TensorSpec& spec : specs) {
    const TensorInfo* info = ckpt_->Find(spec.name);
    const PackedTensor* t = (*pack)->Find(spec.name);
    ASSERT_NE(t, nullptr) << spec.name;
    EXPECT_EQ(t->dtype, info->dtype);
    EXPECT_EQ(t->shape, info->shape);
    ASSERT_EQ(t->length, info->byte_size);
    EXPECT_EQ(t->offset % kTensorAlignment, 0u);
    std::vector<uint8_t> want(info->byte_size), got(t->length);
    ASSERT_TRUE(ckpt_->ReadTensor(*info, want).ok());
    ASSERT_TRUE((*file)->ReadAt(t->offset, got).ok());
    EXPECT_TRUE(want == got) << spec.name;
    EXPECT_EQ(t->hash, Crc32c(0, want.data(), want.size())) << spec.name;
  }
  EXPECT_EQ(Crc32c(0, nullptr, 0), 0u);
  EXPECT_TRUE(VerifyTrunkPack(*ckpt_, **pack).ok());
}

TEST_F(TrunkPackTest, OneAlignedRunPerLayerPlusGlobalsInsideThePack) {
  Pack();
  auto pack = TrunkPack::Open(out(), *ckpt_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  const int64_t layers = ckpt_->config().num_layers;
  ASSERT_EQ((*pack)->runs().size(), static_cast<size_t>(layers + 1));
  uint64_t end = 0;
  for (int64_t l = -1; l < layers; ++l) {
    const PackedRun* run = (*pack)->layer_run(l);
    ASSERT_NE(run, nullptr) << l;
    EXPECT_EQ(run->layer, l);
    EXPECT_EQ(run->offset % 4096, 0u);
    EXPECT_EQ(run->length % 4096, 0u);
    EXPECT_GE(run->offset, end);  // file order: globals, then layers in order
    end = run->offset + run->length;
    for (const PackedTensor& t : run->tensors) {
      EXPECT_GE(t.offset, run->offset);
      EXPECT_LE(t.offset + t.length, run->offset + run->length);
    }
  }
  EXPECT_EQ((*pack)->layer_run(layers), nullptr);
  EXPECT_EQ(std::filesystem::file_size(PackFile()), end);
  EXPECT_EQ((*pack)->Find("no.such.tensor"), nullptr);
  // Routed experts stay out.
  EXPECT_EQ((*pack)->Find(ckpt_->names().Expert(1, 0, 0)), nullptr);
}

TEST_F(TrunkPackTest, ProgressReportsEveryByte) {
  Pack();
  auto pack = TrunkPack::Open(out(), *ckpt_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  uint64_t last = 0, total = 0;
  ASSERT_TRUE(VerifyTrunkPack(*ckpt_, **pack, [&](uint64_t d, uint64_t t) {
                EXPECT_GT(d, last);
                last = d;
                total = t;
              }).ok());
  EXPECT_EQ(last, total);
  EXPECT_GT(total, 0u);
}

TEST_F(TrunkPackTest, WrongFingerprintIsRefused) {
  Pack();
  EditManifest([](ojson& j) { j["fingerprint"] = "0123456789abcdef"; });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("trunk.json"), HasSubstr("fingerprint"),
                                 HasSubstr("0123456789abcdef")));
}

TEST_F(TrunkPackTest, MissingTensorIsNamed) {
  Pack();
  std::string name;
  EditManifest([&](ojson& j) {
    ojson& tensors = j["runs"][RunIndex(j, 5)]["tensors"];
    name = tensors[2]["name"].get<std::string>();
    tensors.erase(2);
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("trunk.json"), HasSubstr(name), HasSubstr("missing")));
}

TEST_F(TrunkPackTest, WrongShapeIsNamed) {
  Pack();
  std::string name;
  EditManifest([&](ojson& j) {
    for (ojson& t : j["runs"][RunIndex(j, 2)]["tensors"]) {
      if (t["shape"].size() == 2 && t["shape"][0] != t["shape"][1]) {
        name = t["name"].get<std::string>();
        t["shape"] = {t["shape"][1], t["shape"][0]};  // same byte count, wrong shape
        return;
      }
    }
  });
  ASSERT_FALSE(name.empty());
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("trunk.json"), HasSubstr(name), HasSubstr("shape")));
}

TEST_F(TrunkPackTest, ShapeThatDisagreesWithTheLengthIsNamed) {
  Pack();
  EditManifest([&](ojson& j) { j["runs"][RunIndex(j, 3)]["tensors"][0]["shape"] = {3}; });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("trunk.json"), HasSubstr("tensors[0]"),
                                 HasSubstr("length"), HasSubstr("shape")));
}

TEST_F(TrunkPackTest, OverlappingRunsAreRefused) {
  Pack();
  EditManifest([&](ojson& j) {
    ojson& a = j["runs"][RunIndex(j, 3)];
    ojson& b = j["runs"][RunIndex(j, 4)];
    b["offset"] = a["offset"];  // its tensors now lie outside it: move them too
    const uint64_t shift = b["tensors"][0]["offset"].get<uint64_t>() - a["offset"].get<uint64_t>();
    for (ojson& t : b["tensors"]) t["offset"] = t["offset"].get<uint64_t>() - shift;
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("trunk.json"), HasSubstr("overlap"),
                                 HasSubstr("layer 3"), HasSubstr("layer 4")));
}

TEST_F(TrunkPackTest, RunPastTheEndIsRefused) {
  Pack();
  EditManifest([&](ojson& j) {
    ojson& last = j["runs"][RunIndex(j, ckpt_->config().num_layers - 1)];
    last["length"] = last["length"].get<uint64_t>() + 4096;
  });
  EXPECT_THAT(OpenError(),
              AllOf(HasSubstr("trunk.json"), HasSubstr("past the end"), HasSubstr("pack_bytes")));
}

TEST_F(TrunkPackTest, UnalignedRunIsRefused) {
  Pack();
  EditManifest([&](ojson& j) {
    ojson& run = j["runs"][RunIndex(j, 1)];
    run["offset"] = run["offset"].get<uint64_t>() + 64;
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("trunk.json"), HasSubstr("layer 1"), HasSubstr("4096")));
}

TEST_F(TrunkPackTest, TruncatedPackFileIsDataLoss) {
  Pack();
  const uint64_t size = std::filesystem::file_size(PackFile());
  std::filesystem::resize_file(PackFile(), size - 4096);
  EXPECT_THAT(OpenError(absl::StatusCode::kDataLoss),
              AllOf(HasSubstr("trunk.pack"), HasSubstr("shorter"), HasSubstr("pack_bytes")));
}

TEST_F(TrunkPackTest, MissingPackFileIsNotFound) {
  Pack();
  std::filesystem::remove(PackFile());
  EXPECT_THAT(OpenError(absl::StatusCode::kNotFound), HasSubstr("trunk.pack"));
}

TEST_F(TrunkPackTest, OneFlippedByteFailsVerificationNamingTheTensor) {
  Pack();
  auto pack = TrunkPack::Open(out(), *ckpt_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  const PackedTensor& t = (*pack)->layer_run(6)->tensors[3];
  const uint64_t at = t.offset + t.length / 2;
  {
    std::fstream f(PackFile(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    const char c = static_cast<char>(f.get() ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(c);
  }
  absl::Status s = VerifyTrunkPack(*ckpt_, **pack);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(t.name), HasSubstr("trunk.pack"),
                                 HasSubstr(absl::StrCat("offset ", at))));
}

TEST_F(TrunkPackTest, WrongHashInTheManifestFailsVerification) {
  Pack();
  std::string name;
  EditManifest([&](ojson& j) {
    ojson& t = j["runs"][RunIndex(j, -1)]["tensors"][1];
    name = t["name"].get<std::string>();
    t["crc32c"] = t["crc32c"].get<uint64_t>() ^ 1;
  });
  auto pack = TrunkPack::Open(out(), *ckpt_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  absl::Status s = VerifyTrunkPack(*ckpt_, **pack);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(name), HasSubstr("CRC-32C")));
}

TEST_F(TrunkPackTest, FailedWriteLeavesNoPartialFilesAndNoPack) {
  // trunk.pack as a non-empty directory: the final rename fails after all bytes were written.
  std::filesystem::create_directories(out() + "/trunk.pack/blocker");
  auto r = WriteTrunkPack(*ckpt_, out(), PackOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("trunk.pack"));
  for (const auto& entry : std::filesystem::directory_iterator(out())) {
    EXPECT_FALSE(entry.path().string().ends_with(".partial")) << entry.path();
  }
  EXPECT_FALSE(io::FileExists(Manifest()));
  EXPECT_FALSE(TrunkPack::Open(out(), *ckpt_).ok());
}

TEST_F(TrunkPackTest, RepackingReplacesTheOldPack) {
  Pack();
  Pack();
  EXPECT_TRUE(TrunkPack::Open(out(), *ckpt_).ok());
  EXPECT_FALSE(io::FileExists(PackFile() + ".partial"));
  EXPECT_FALSE(io::FileExists(Manifest() + ".partial"));
}

TEST_F(TrunkPackTest, OnlyAPartialPackIsRefused) {
  Pack();
  std::filesystem::rename(PackFile(), PackFile() + ".partial");
  std::filesystem::remove(Manifest());
  EXPECT_THAT(OpenError(absl::StatusCode::kNotFound),
              AllOf(HasSubstr("no trunk pack"), HasSubstr("trunk.pack.partial")));
}

TEST(TrunkPackManifestTest, StructureErrorsNameTheKey) {
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {"[]", "not a JSON object"},
      {R"({"format":"other","version":1})", "format"},
      {R"({"format":"k3-trunk-pack","version":9})", "version"},
      {R"({"format":"k3-trunk-pack","version":1,"fingerprint":"x","pack_file":"../p",
           "pack_bytes":0,"runs":[]})",
       "pack_file"},
      {R"({"format":"k3-trunk-pack","version":1,"fingerprint":"x","pack_file":"p",
           "pack_bytes":4096,"runs":[{"layer":-2,"offset":0,"length":4096,"tensors":[]}]})",
       "runs[0].layer"},
      {R"({"format":"k3-trunk-pack","version":1,"fingerprint":"x","pack_file":"p",
           "pack_bytes":4096,"runs":[{"layer":0,"offset":0,"length":4096,"tensors":[
             {"name":"a","dtype":"Q4","shape":[1],"offset":0,"length":1,"crc32c":0}]}]})",
       "runs[0] (layer 0).tensors[0] (a).dtype"},
      {R"({"format":"k3-trunk-pack","version":1,"fingerprint":"x","pack_file":"p",
           "pack_bytes":8192,"runs":[
             {"layer":0,"offset":0,"length":4096,"tensors":[]},
             {"layer":0,"offset":4096,"length":4096,"tensors":[]}]})",
       "layer 0 has two runs"},
  };
  for (const Case& c : cases) {
    auto pack = TrunkPack::ParseManifest(c.json, "dir/trunk.json");
    ASSERT_FALSE(pack.ok()) << c.json;
    EXPECT_EQ(pack.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(pack.status().message(), AllOf(HasSubstr("dir/trunk.json"), HasSubstr(c.expect)))
        << c.json;
  }
}

TEST(TrunkPackManifestTest, AWellFormedManifestParsesWithoutACheckpoint) {
  auto pack = TrunkPack::ParseManifest(
      R"({"format":"k3-trunk-pack","version":1,"fingerprint":"x","pack_file":"trunk.pack",
          "pack_bytes":8192,"runs":[
            {"layer":0,"offset":4096,"length":4096,"tensors":[
              {"name":"n","dtype":"F32","shape":[2,3],"offset":4096,"length":24,"crc32c":7}]},
            {"layer":"globals","offset":0,"length":4096,"tensors":[]}]})",
      "dir/trunk.json");
  ASSERT_TRUE(pack.ok()) << pack.status();
  EXPECT_EQ((*pack)->pack_path(), "dir/trunk.pack");
  ASSERT_EQ((*pack)->runs().size(), 2u);
  EXPECT_EQ((*pack)->runs()[0].layer, -1);  // file order
  ASSERT_NE((*pack)->Find("n"), nullptr);
  EXPECT_EQ((*pack)->Find("n")->hash, 7u);
  EXPECT_EQ((*pack)->Find("n")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*pack)->layer_run(0)->tensors.size(), 1u);
}

}  // namespace
}  // namespace k3
