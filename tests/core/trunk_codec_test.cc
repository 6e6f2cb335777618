// The compressed trunk pack (`k3 pack --codec bf16-e3`): what it stores, that it verifies, and
// that every kind of damage is refused with the file and offset named.
#include "core/checkpoint/trunk_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/tensor_names.h"
#include "tests/core/trunk_pack_fixture.h"

namespace k3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Small blocks, so that the tiny model's matrices have several.
constexpr uint64_t kSmallBlocks = 16 << 10;

class TrunkCodecTest : public TrunkPackTest {
 protected:
  void PackCompressed() { Pack({.codec = kBf16Codec, .block_bytes = kSmallBlocks}); }

  std::unique_ptr<TrunkPack> OpenPack() {
    auto pack = TrunkPack::Open(out(), *ckpt_);
    EXPECT_TRUE(pack.ok()) << pack.status();
    return pack.ok() ? *std::move(pack) : nullptr;
  }

  // The first compressed tensor with more than one block.
  static const PackedTensor* MultiBlock(const TrunkPack& pack) {
    for (const PackedRun& run : pack.runs()) {
      for (const PackedTensor& t : run.tensors) {
        if (t.blocks.size() > 1) return &t;
      }
    }
    return nullptr;
  }

  void FlipByte(uint64_t at) {
    std::fstream f(PackFile(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    const char c = static_cast<char>(f.get() ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(c);
  }
};

TEST(RowsPerBlockTest, WholeRowsInMultiplesOf64AboutTheTarget) {
  EXPECT_EQ(RowsPerBlock(100, 256, 4 << 20), 100u);           // the whole matrix fits
  EXPECT_EQ(RowsPerBlock(7168, 14336, 4 << 20), 256u);        // 292 rows fit: 4 x 64
  EXPECT_EQ(RowsPerBlock(7168, 67584, 4 << 20), 64u);         // a wide row: at least 64
  EXPECT_EQ(RowsPerBlock(1 << 20, 14336, 4 << 20) % 64, 0u);  // lm_head
}

// BlockHash takes the library's runtime-dispatched (AVX2/AVX-512) XXH3: it must be the plain
// XXH3-64 that packs were written with, at every length class (short, mid, the vector loop).
TEST(BlockHashTest, IsXxh3As64BitsOfTheStoredBytes) {
  EXPECT_EQ(BlockHash({}), 0x2D06800538D394C2ull);  // XXH3-64 of no bytes, the published vector
  std::vector<uint8_t> bytes(3 << 20);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  for (size_t n : {size_t{1}, size_t{17}, size_t{200}, size_t{4096}, bytes.size()}) {
    EXPECT_EQ(BlockHash({bytes.data(), n}), XXH3_64bits(bytes.data(), n)) << n << " bytes";
  }
}

TEST_F(TrunkCodecTest, BF16MatricesButTheEmbeddingAreCompressedAndVerify) {
  PackCompressed();
  auto pack = OpenPack();
  ASSERT_NE(pack, nullptr);
  EXPECT_EQ(pack->codec(), kBf16Codec);
  int compressed = 0;
  for (const TensorSpec& spec : TrunkTensorSpecs(ckpt_->config(), ckpt_->names())) {
    const TensorInfo* info = ckpt_->Find(spec.name);
    const PackedTensor* t = pack->Find(spec.name);
    ASSERT_NE(t, nullptr) << spec.name;
    EXPECT_EQ(t->compressed(), IsCompressible(*info, spec.group == TensorGroup::kEmbedding))
        << spec.name;
    EXPECT_EQ(t->length, info->byte_size);
    if (!t->compressed()) continue;
    ++compressed;
    uint64_t rows = 0;
    for (const PackedBlock& b : t->blocks) {
      EXPECT_EQ(b.offset % 4096, 0u) << spec.name;
      rows += b.rows;
    }
    EXPECT_EQ(rows, static_cast<uint64_t>(info->shape[0]));
  }
  EXPECT_GT(compressed, 10);
  ASSERT_NE(MultiBlock(*pack), nullptr);
  // The synthetic weights are Gaussian: the tensors' bytes shrink.
  EXPECT_LT(pack->stored_tensor_bytes(), pack->tensor_bytes());
  EXPECT_TRUE(VerifyTrunkPack(*ckpt_, *pack).ok());
}

TEST_F(TrunkCodecTest, EveryBlockDecodesToTheCheckpointsRows) {
  PackCompressed();
  auto pack = OpenPack();
  ASSERT_NE(pack, nullptr);
  auto file = io::RandomAccessFile::Open(pack->pack_path());
  ASSERT_TRUE(file.ok());
  const PackedTensor& t = *MultiBlock(*pack);
  const TensorInfo& info = *ckpt_->Find(t.name);
  std::vector<uint8_t> want(info.byte_size);
  ASSERT_TRUE(ckpt_->ReadTensor(info, want).ok());
  const uint64_t row_bytes = t.length / t.shape[0];
  uint64_t row = 0;
  for (const PackedBlock& b : t.blocks) {
    std::vector<uint8_t> stored(b.length), got(b.rows * row_bytes);
    ASSERT_TRUE((*file)->ReadAt(b.offset, stored).ok());
    ASSERT_TRUE(DecodeBlock(t, b, stored, got, pack->pack_path()).ok());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + row * row_bytes)) << row;
    row += b.rows;
  }
}

TEST_F(TrunkCodecTest, ADamagedBlockIsDataLossNamingTheFileTheOffsetAndTheTensor) {
  PackCompressed();
  auto pack = OpenPack();
  ASSERT_NE(pack, nullptr);
  const PackedTensor& t = *MultiBlock(*pack);
  const PackedBlock& b = t.blocks[1];
  FlipByte(b.offset + b.length / 2);
  absl::Status s = VerifyTrunkPack(*ckpt_, *pack);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("trunk.pack"), HasSubstr(t.name),
                    HasSubstr(absl::StrCat("offset ", b.offset)), HasSubstr("checksum")));
}

TEST_F(TrunkCodecTest, BlockBytesThatAgreeWithAWrongHashAreStillRefused) {
  PackCompressed();
  std::string name;
  EditManifest([&](ojson& j) {
    for (ojson& run : j["runs"]) {
      for (ojson& t : run["tensors"]) {
        if (!t.contains("blocks") || !name.empty()) continue;
        name = t["name"].get<std::string>();
        t["blocks"][0][3] = t["blocks"][0][3].get<uint64_t>() ^ 1;
      }
    }
  });
  auto pack = OpenPack();
  ASSERT_NE(pack, nullptr);
  absl::Status s = VerifyTrunkPack(*ckpt_, *pack);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(name), HasSubstr("checksum")));
}

TEST_F(TrunkCodecTest, ATruncatedPackIsDataLoss) {
  PackCompressed();
  std::filesystem::resize_file(PackFile(), std::filesystem::file_size(PackFile()) - 4096);
  EXPECT_THAT(OpenError(absl::StatusCode::kDataLoss),
              AllOf(HasSubstr("trunk.pack"), HasSubstr("shorter")));
}

TEST_F(TrunkCodecTest, APackOfAnotherCheckpointIsRefusedByItsFingerprint) {
  PackCompressed();
  EditManifest([](ojson& j) { j["fingerprint"] = "fedcba9876543210"; });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("trunk.json"), HasSubstr("fingerprint")));
}

TEST_F(TrunkCodecTest, AnUnknownCodecOrCodecVersionIsRefused) {
  PackCompressed();
  EditManifest([](ojson& j) { j["codec"]["version"] = kPackCodecVersion + 1; });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("trunk.json"), HasSubstr("codec"),
                                 HasSubstr(absl::StrCat("version ", kPackCodecVersion + 1))));
  PackCompressed();
  EditManifest([](ojson& j) { j["codec"]["name"] = "zstd"; });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("codec"), HasSubstr("zstd")));
  PackCompressed();
  EditManifest([](ojson& j) { j.erase("codec"); });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("codec"), HasSubstr("missing")));
}

TEST_F(TrunkCodecTest, CompressedTensorsInAVersion1ManifestAreRefused) {
  PackCompressed();
  EditManifest([](ojson& j) {
    j["version"] = kTrunkPackVersion;
    j.erase("codec");
  });
  EXPECT_THAT(OpenError(), HasSubstr("compressed in a pack of version 1"));
}

TEST_F(TrunkCodecTest, BlocksThatDoNotHoldTheRowsAreRefused) {
  PackCompressed();
  EditManifest([](ojson& j) {
    for (ojson& run : j["runs"]) {
      for (ojson& t : run["tensors"]) {
        if (t.contains("blocks") && t["blocks"].size() > 1) {
          t["blocks"].erase(t["blocks"].size() - 1);
          return;
        }
      }
    }
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("blocks"), HasSubstr("rows")));
  PackCompressed();
  EditManifest([](ojson& j) {
    for (ojson& run : j["runs"]) {
      for (ojson& t : run["tensors"]) {
        if (t.contains("blocks") && t["blocks"].size() > 1) {
          t["blocks"][1][1] = t["blocks"][1][1].get<uint64_t>() + 64;
          return;
        }
      }
    }
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("blocks[1]"), HasSubstr("4096")));
}

TEST_F(TrunkCodecTest, AnUnknownCodecIsRefusedBeforeAnythingIsWritten) {
  auto r = WriteTrunkPack(*ckpt_, out(), {.codec = "zstd"});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("zstd"));
  EXPECT_FALSE(io::FileExists(PackFile()));
}

}  // namespace
}  // namespace k3
