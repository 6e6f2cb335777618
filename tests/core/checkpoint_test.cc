#include "core/checkpoint/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/synth/synth.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "tests/util/permute_experts.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ojson = nlohmann::ordered_json;

constexpr char kLayer1Shard[] = "model-00002-of-00014.safetensors";

// A synthetic tiny checkpoint (release layout: 14 shards with an index) in a temp dir.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions opt = testing::TinyModel(dir_.path());
    opt.seed = 7;
    auto r = Synthesize(opt);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  std::string Path(const std::string& name) const { return dir_ / name; }

  // The header text and data section of a shard.
  static std::pair<std::string, std::string> ReadShard(const std::string& path) {
    auto bytes = io::ReadFileToString(path);
    EXPECT_TRUE(bytes.ok());
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>((*bytes)[i]);
    return {bytes->substr(8, n), bytes->substr(8 + n)};
  }

  static void WriteShard(const std::string& path, const std::string& header,
                         const std::string& data, uint64_t declared_length) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((declared_length >> (8 * i)) & 0xff));
    out << header << data;
  }

  void EditHeaderText(const std::string& shard, const std::function<void(std::string&)>& edit) {
    auto [header, data] = ReadShard(Path(shard));
    edit(header);
    WriteShard(Path(shard), header, data, header.size());
  }

  // Edits the JSON of a shard's header; the data section stays where it was.
  void EditHeader(const std::string& shard, const std::function<void(ojson&)>& edit) {
    EditHeaderText(shard, [&](std::string& text) {
      ojson j = ojson::parse(text);
      edit(j);
      std::string fresh = j.dump();
      // Keep the header length (offsets are relative to its end): pad, or fail loudly.
      ASSERT_LE(fresh.size(), text.size());
      text = fresh + std::string(text.size() - fresh.size(), ' ');
    });
  }

  // Adds a U8 tensor as the first entry of a shard's header and of the index, its bytes
  // appended to the shard's data.
  void AddTensorFirst(const std::string& shard, const std::string& name,
                      const std::vector<int64_t>& shape) {
    auto [header, data] = ReadShard(Path(shard));
    const ojson old = ojson::parse(header);
    const uint64_t bytes = static_cast<uint64_t>(shape[0] * shape[1]);
    ojson j = ojson::object();
    j[name] = {
        {"dtype", "U8"}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes}}};
    for (auto it = old.begin(); it != old.end(); ++it) j[it.key()] = it.value();
    std::string text = j.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    WriteShard(Path(shard), text, data + std::string(bytes, '\x11'), text.size());
    EditIndex([&](ojson& index) {
      ojson map = ojson::object();
      map[name] = shard;
      for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
        map[it.key()] = it.value();
      }
      index["weight_map"] = map;
    });
  }

  void EditIndex(const std::function<void(ojson&)>& edit) {
    auto text = io::ReadFileToString(Path("model.safetensors.index.json"));
    ASSERT_TRUE(text.ok());
    ojson index = ojson::parse(*text);
    edit(index);
    ASSERT_TRUE(io::WriteFileAtomically(Path("model.safetensors.index.json"), index.dump()).ok());
  }

  std::string OpenError() {
    auto ckpt = Checkpoint::Open(dir_.path());
    EXPECT_FALSE(ckpt.ok()) << "a damaged checkpoint opened";
    return ckpt.ok() ? "" : std::string(ckpt.status().message());
  }

  absl::StatusCode OpenCode() { return Checkpoint::Open(dir_.path()).status().code(); }

  testing::TempDir dir_;
};

TEST_F(CheckpointTest, OpensTheSyntheticCheckpoint) {
  auto ckpt = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const Checkpoint& c = **ckpt;
  EXPECT_EQ(c.shard_paths().size(), 14u);
  EXPECT_EQ(c.tensors().size(), 916u);
  EXPECT_EQ(c.names().prefix(), "language_model.");
  ASSERT_NE(c.Find("language_model.lm_head.weight"), nullptr);
  EXPECT_EQ(c.Find("language_model.nonexistent"), nullptr);
  const ExpertLocation& e = c.expert(1, 3);
  EXPECT_TRUE(e.contiguous());
  EXPECT_EQ(e.total_bytes, static_cast<uint64_t>(c.config().expert_bytes()));
  EXPECT_EQ(e.spans[0].offset, c.Find(c.names().Expert(1, 3, 0))->file_offset);
  EXPECT_EQ(e.part_offset[2], 64 * 32 + 64 * 2);  // after w1: packed [64, 32] + scale [64, 2]
}

TEST_F(CheckpointTest, OpensTheExternalSingleFileFixture) {
  auto ckpt = Checkpoint::Open(testing::SharedDir() + "/fixtures/reference-tiny");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->shard_paths().size(), 1u);
  EXPECT_TRUE((*ckpt)->expert(12, 7).contiguous());
}

TEST_F(CheckpointTest, ExpertsThatAreNotAdjacentGetSeveralSpansWithTheSameBytes) {
  auto before = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(before.ok());
  const TensorNames& names = (*before)->names();
  std::vector<uint8_t> expected((*before)->Find(names.Expert(1, 0, 0))->byte_size);
  ASSERT_TRUE((*before)->ReadTensor(*(*before)->Find(names.Expert(1, 0, 0)), expected).ok());
  // Swap where experts 0 and 1 keep w1.weight_packed (same size).
  EditHeader(kLayer1Shard, [&](ojson& j) {
    std::swap(j[names.Expert(1, 0, 0)]["data_offsets"], j[names.Expert(1, 1, 0)]["data_offsets"]);
  });
  auto ckpt = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ExpertLocation& e = (*ckpt)->expert(1, 1);
  EXPECT_FALSE(e.contiguous());
  ASSERT_EQ(e.spans.size(), 2u);
  EXPECT_EQ(e.total_bytes, static_cast<uint64_t>((*ckpt)->config().expert_bytes()));
  // Expert 1's w1 now lives where expert 0's was: first in the file, so first of the spans.
  EXPECT_EQ(e.spans[0].offset, (*before)->expert(1, 0).spans[0].offset);
  EXPECT_EQ(e.spans[0].length, expected.size());
  EXPECT_EQ(e.part_offset[0], 0u);
  // Expert 0's w1 now follows its w3: its six tensors still tile one range, so one read.
  const ExpertLocation& first = (*ckpt)->expert(1, 0);
  ASSERT_TRUE(first.contiguous());
  EXPECT_EQ(first.spans[0].offset, (*before)->expert(1, 0).spans[0].offset + expected.size());
  EXPECT_EQ(first.part_offset[0], first.total_bytes - expected.size());
  EXPECT_EQ(first.part_offset[1], 0u);
}

// Each expert's six tensors in another order inside the same range: still one span each, and
// every part's bytes, read alone or cut from the span, are the ones it had.
TEST_F(CheckpointTest, ExpertPartsInAnyOrderWithinOneRangeAreOneSpan) {
  auto before = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(testing::PermuteExpertParts(dir_.path(), {5, 2, 0, 4, 1, 3}).ok());
  auto after = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(after.ok()) << after.status();
  const Checkpoint& a = **after;
  const Checkpoint& b = **before;
  for (int64_t l = 1; l < a.config().num_layers; ++l) {
    for (int64_t e = 0; e < a.config().num_experts; ++e) {
      const ExpertLocation& loc = a.expert(l, e);
      ASSERT_TRUE(loc.contiguous()) << l << "/" << e;
      EXPECT_EQ(loc.spans[0].offset, b.expert(l, e).spans[0].offset);
      EXPECT_EQ(loc.spans[0].length, b.expert(l, e).spans[0].length);
      EXPECT_EQ(loc.part_offset[5], 0u);
      std::vector<uint8_t> span(loc.total_bytes);
      ASSERT_TRUE(a.ReadSpan(loc.spans[0], span).ok());
      for (int part = 0; part < 6; ++part) {
        const TensorInfo* t = a.Find(a.names().Expert(l, e, part));
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->file_offset, loc.spans[0].offset + loc.part_offset[part]);
        std::vector<uint8_t> was(b.PartBytes(part)), is(a.PartBytes(part));
        ASSERT_TRUE(b.ReadTensor(*b.Find(b.names().Expert(l, e, part)), was).ok());
        ASSERT_TRUE(a.ReadTensor(*t, is).ok());
        EXPECT_EQ(is, was) << t->name;
        EXPECT_TRUE(std::equal(was.begin(), was.end(), span.begin() + loc.part_offset[part]))
            << t->name;
      }
    }
  }
}

TEST_F(CheckpointTest, FloatTensorsReadTheSameInEveryDtype) {
  testing::TempDir f16_dir, f32_dir;
  for (auto [dir, floats] :
       {std::pair{&f16_dir, SynthFloats::kF16}, {&f32_dir, SynthFloats::kF32}}) {
    SynthOptions opt;
    opt.out_dir = dir->path();
    opt.seed = 7;
    opt.floats = floats;
    ASSERT_TRUE(Synthesize(opt).ok());
  }
  auto bf = Checkpoint::Open(dir_.path());
  auto f16 = Checkpoint::Open(f16_dir.path());
  auto f32 = Checkpoint::Open(f32_dir.path());
  ASSERT_TRUE(bf.ok() && f16.ok() && f32.ok());
  const std::string name = "language_model.model.layers.2.self_attn.q_proj.weight";
  EXPECT_EQ((*bf)->Find(name)->dtype, DType::kBF16);
  EXPECT_EQ((*f16)->Find(name)->dtype, DType::kF16);
  EXPECT_EQ((*f32)->Find(name)->dtype, DType::kF32);
  auto a = (*bf)->ReadTensorAsFloat(*(*bf)->Find(name));
  auto b = (*f16)->ReadTensorAsFloat(*(*f16)->Find(name));
  auto c = (*f32)->ReadTensorAsFloat(*(*f32)->Find(name));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (size_t i = 0; i < c->size(); ++i) {
    ASSERT_NEAR((*a)[i], (*c)[i], std::abs((*c)[i]) * 0x1p-8 + 1e-30) << i;
    ASSERT_NEAR((*b)[i], (*c)[i], std::abs((*c)[i]) * 0x1p-11 + 0x1p-24) << i;
  }
}

// ---- Damaged checkpoints: each refused, with a message that names the file ----

TEST_F(CheckpointTest, HeaderLengthBeyondTheFile) {
  auto [header, data] = ReadShard(Path(kLayer1Shard));
  WriteShard(Path(kLayer1Shard), header, data, 8 + header.size() + data.size());
  std::string msg = OpenError();
  EXPECT_THAT(msg, HasSubstr(Path(kLayer1Shard)));
  EXPECT_THAT(msg, HasSubstr("runs past the end of the file"));
  EXPECT_EQ(OpenCode(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, AbsurdHeaderLength) {
  auto [header, data] = ReadShard(Path(kLayer1Shard));
  WriteShard(Path(kLayer1Shard), header, data, 1ull << 40);
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("is absurd")));
}

TEST_F(CheckpointTest, FileShorterThanTheLengthPrefix) {
  std::filesystem::resize_file(Path(kLayer1Shard), 5);
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("shorter than the")));
}

TEST_F(CheckpointTest, HeaderThatIsNotJson) {
  EditHeaderText(kLayer1Shard, [](std::string& t) { t[0] = '#'; });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("not valid JSON")));
}

TEST_F(CheckpointTest, HeaderThatIsNotAnObject) {
  EditHeaderText(kLayer1Shard, [](std::string& t) {
    std::string arr = "[1,2,3]";
    t = arr + std::string(t.size() - arr.size(), ' ');
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("not an object")));
}

TEST_F(CheckpointTest, OffsetsOutOfOrder) {
  EditHeader(kLayer1Shard, [](ojson& j) {
    ojson& off = j["language_model.model.layers.1.input_layernorm.weight"]["data_offsets"];
    std::swap(off[0], off[1]);
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("input_layernorm.weight"),
                                 HasSubstr("out of order")));
}

TEST_F(CheckpointTest, OverlappingTensors) {
  EditHeader(kLayer1Shard, [](ojson& j) {
    ojson& off = j["language_model.model.layers.1.post_attention_layernorm.weight"]["data_offsets"];
    off[0] = off[0].get<uint64_t>() - 2;
    off[1] = off[1].get<uint64_t>() - 2;
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("overlap")));
}

TEST_F(CheckpointTest, TruncatedShard) {
  const auto size = std::filesystem::file_size(Path(kLayer1Shard));
  std::filesystem::resize_file(Path(kLayer1Shard), size - 100);
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("past the end")));
}

TEST_F(CheckpointTest, ByteCountThatDoesNotMatchTheShape) {
  EditHeader(kLayer1Shard, [](ojson& j) {
    j["language_model.model.layers.1.input_layernorm.weight"]["shape"] = {64};
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("needs 128")));
}

TEST_F(CheckpointTest, DuplicateTensorName) {
  EditHeaderText(kLayer1Shard, [](std::string& t) {
    const std::string name = "\"language_model.model.layers.1.input_layernorm.weight\"";
    size_t at = t.find(name);
    size_t end = t.find('}', at);
    std::string entry = t.substr(at, end - at + 1);
    t.insert(1, entry + ",");
    t.resize(t.find_last_not_of(' ') + 1);
    while (t.size() % 8) t += ' ';
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("listed twice")));
}

TEST_F(CheckpointTest, UnsupportedDtypeIsNamed) {
  EditHeader(kLayer1Shard, [](ojson& j) {
    ojson& t = j["language_model.model.layers.1.self_attn.A_log"];
    t["dtype"] = "I32";  // same size as F32
  });
  EXPECT_THAT(OpenError(),
              AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("unsupported dtype \"I32\"")));
}

TEST_F(CheckpointTest, IndexNamingAMissingShard) {
  std::filesystem::remove(Path("model-00005-of-00014.safetensors"));
  EXPECT_THAT(OpenError(),
              AllOf(HasSubstr("model.safetensors.index.json"),
                    HasSubstr("model-00005-of-00014.safetensors, which does not exist")));
  EXPECT_EQ(OpenCode(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, IndexThatIsNotJson) {
  ASSERT_TRUE(
      io::WriteFileAtomically(Path("model.safetensors.index.json"), "{\"weight_map\":").ok());
  EXPECT_THAT(OpenError(), HasSubstr(Path("model.safetensors.index.json")));
}

// The index is checked as JSON where it is only stepped over, and after its end.
TEST_F(CheckpointTest, IndexThatIsNotJsonWhereItIsSkipped) {
  auto text = io::ReadFileToString(Path("model.safetensors.index.json"));
  ASSERT_TRUE(text.ok());
  const nlohmann::json index = nlohmann::json::parse(*text);
  const std::string map = index["weight_map"].dump();
  for (const std::string& bad :
       {R"({"metadata":{"total_size":1e999},"weight_map":)" + map + "}",
        R"({"metadata":{"total_size":"\x"},"weight_map":)" + map + "}",
        R"({"weight_map":)" + map + "} {}", R"({"weight_map":)" + map + ",}"}) {
    ASSERT_TRUE(io::WriteFileAtomically(Path("model.safetensors.index.json"), bad).ok());
    EXPECT_THAT(OpenError(),
                AllOf(HasSubstr(Path("model.safetensors.index.json")), HasSubstr("not valid JSON")))
        << bad.substr(0, 60);
  }
}

// The index is read whole, so a file far larger than any index is refused before it is read.
TEST_F(CheckpointTest, IndexTooLargeToBeOne) {
  std::filesystem::resize_file(Path("model.safetensors.index.json"), (1ull << 30) + 1);
  EXPECT_THAT(OpenError(), AllOf(HasSubstr(Path("model.safetensors.index.json")),
                                 HasSubstr("more than any index")));
}

// nlohmann took a NUL byte for the end of the input: a header padded with NULs rather than
// spaces opened, and so did an index with anything after a NUL. Both still do.
TEST_F(CheckpointTest, HeaderAndIndexEndedByANulOpen) {
  size_t padding = 0;
  EditHeaderText(kLayer1Shard, [&](std::string& t) {
    const size_t end = t.find_last_not_of(' ') + 1;
    padding = t.size() - end;
    t = t.substr(0, end) + std::string(padding, '\0');
  });
  ASSERT_GT(padding, 0u) << "the shard's header needs padding for this test";
  auto text = io::ReadFileToString(Path("model.safetensors.index.json"));
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(io::WriteFileAtomically(Path("model.safetensors.index.json"),
                                      *text + std::string(1, '\0') + "{not json")
                  .ok());
  auto ckpt = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->tensors().size(), 916u);
}

TEST_F(CheckpointTest, IndexPlacingATensorInTheWrongShard) {
  auto text = io::ReadFileToString(Path("model.safetensors.index.json"));
  nlohmann::json index = nlohmann::json::parse(*text);
  index["weight_map"]["language_model.model.norm.weight"] = kLayer1Shard;
  ASSERT_TRUE(io::WriteFileAtomically(Path("model.safetensors.index.json"), index.dump()).ok());
  EXPECT_THAT(OpenError(),
              AllOf(HasSubstr("model.safetensors.index.json"),
                    HasSubstr("language_model.model.norm.weight"), HasSubstr("does not list it")));
}

TEST_F(CheckpointTest, MissingTensorsAreAllListed) {
  const std::string a = "language_model.model.layers.1.self_attn.dt_bias";
  const std::string b = "language_model.model.layers.1.block_sparse_moe.experts.5.w2.weight_scale";
  EditHeader(kLayer1Shard, [&](ojson& j) {
    j.erase(a);
    j.erase(b);
  });
  auto text = io::ReadFileToString(Path("model.safetensors.index.json"));
  nlohmann::json index = nlohmann::json::parse(*text);
  index["weight_map"].erase(a);
  index["weight_map"].erase(b);
  ASSERT_TRUE(io::WriteFileAtomically(Path("model.safetensors.index.json"), index.dump()).ok());
  std::string msg = OpenError();
  EXPECT_THAT(msg, HasSubstr("(2 problems)"));
  EXPECT_THAT(msg, HasSubstr(a + " is missing"));
  EXPECT_THAT(msg, HasSubstr(b + " is missing"));
  EXPECT_THAT(msg, HasSubstr(dir_.path()));
}

TEST_F(CheckpointTest, ShapeThatContradictsTheConfig) {
  EditHeader(kLayer1Shard, [](ojson& j) {
    j["language_model.model.layers.1.self_attn.q_proj.weight"]["shape"] = {128, 64};
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("q_proj.weight has shape [128, 64], expected [64, 128]"),
                                 HasSubstr(Path(kLayer1Shard))));
}

TEST_F(CheckpointTest, ExpertStoredAsFloat) {
  EditHeader(kLayer1Shard, [](ojson& j) {
    ojson& t = j["language_model.model.layers.1.block_sparse_moe.experts.2.w3.weight_packed"];
    t["dtype"] = "BF16";
    t["shape"] = {64, 16};  // same bytes, half the elements
  });
  EXPECT_THAT(OpenError(), HasSubstr("experts.2.w3.weight_packed has shape [64, 16]"));
}

// Routed-expert parts are kept as spans, not as TensorInfo: the list and Find() must still give
// every tensor of every header, once, where its header puts it.
TEST_F(CheckpointTest, EveryHeaderEntryIsListedOnceAndFoundWhereItIs) {
  auto ckpt = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const Checkpoint& c = **ckpt;
  std::map<std::string, TensorInfo> headers;
  for (size_t shard = 0; shard < c.shard_paths().size(); ++shard) {
    auto [header, data] = ReadShard(c.shard_paths()[shard]);
    auto parsed = ParseSafetensorsHeader(header, 8 + header.size() + data.size(),
                                         static_cast<int>(shard), c.shard_paths()[shard]);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    for (TensorInfo& t : *parsed) headers.emplace(t.name, std::move(t));
  }
  ASSERT_EQ(c.tensors().size(), headers.size());
  std::set<std::string> seen;
  auto same = [](const TensorInfo& a, const TensorInfo& b) {
    return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.shard == b.shard &&
           a.file_offset == b.file_offset && a.byte_size == b.byte_size;
  };
  for (const TensorInfo& t : c.tensors()) {
    ASSERT_TRUE(seen.insert(t.name).second) << t.name << " listed twice";
    ASSERT_TRUE(headers.contains(t.name)) << t.name;
    EXPECT_TRUE(same(t, headers[t.name])) << t.name;
    const TensorInfo* found = c.Find(t.name);
    ASSERT_NE(found, nullptr) << t.name;
    EXPECT_TRUE(same(*found, t)) << t.name;
  }
  const std::string part = c.names().Expert(4, 7, 3);
  EXPECT_EQ(c.Find(part), c.Find(part));                  // made once, then kept
  EXPECT_EQ(c.Find(c.names().Expert(0, 0, 0)), nullptr);  // layer 0 is dense
  EXPECT_EQ(c.Find(c.names().Expert(1, 8, 0)), nullptr);  // 8 experts: 0..7
}

TEST_F(CheckpointTest, ExpertPartListedTwice) {
  EditHeaderText(kLayer1Shard, [](std::string& t) {
    const std::string name =
        "\"language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_scale\"";
    size_t at = t.find(name);
    size_t end = t.find('}', at);
    t.insert(1, t.substr(at, end - at + 1) + ",");
    t.resize(t.find_last_not_of(' ') + 1);
    while (t.size() % 8) t += ' ';
  });
  EXPECT_THAT(OpenError(),
              AllOf(HasSubstr(Path(kLayer1Shard)), HasSubstr("experts.3.w2.weight_scale"),
                    HasSubstr("listed twice")));
}

TEST_F(CheckpointTest, TensorInTwoShards) {
  for (const char* name :
       {"input_layernorm.weight", "block_sparse_moe.experts.0.w1.weight_packed"}) {
    SetUp();  // a fresh checkpoint
    const std::string layer1 = absl::StrCat("language_model.model.layers.1.", name);
    const std::string layer2 = absl::StrCat("language_model.model.layers.2.", name);
    EditHeader("model-00003-of-00014.safetensors", [&](ojson& j) {
      j[layer1] = j[layer2];
      j.erase(layer2);
    });
    EXPECT_THAT(OpenError(),
                AllOf(HasSubstr("tensor " + layer1 + " is in both"), HasSubstr(Path(kLayer1Shard)),
                      HasSubstr(Path("model-00003-of-00014.safetensors"))));
  }
}

TEST_F(CheckpointTest, IndexPlacingAnExpertInTheWrongShard) {
  const std::string name =
      "language_model.model.layers.1.block_sparse_moe.experts.6.w3.weight_packed";
  EditIndex([&](ojson& index) { index["weight_map"][name] = "model-00003-of-00014.safetensors"; });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("model.safetensors.index.json places tensor " + name),
                                 HasSubstr("does not list it")));
}

TEST_F(CheckpointTest, IndexListingAnExpertTheHeaderLacks) {
  const std::string name =
      "language_model.model.layers.1.block_sparse_moe.experts.6.w3.weight_packed";
  EditHeader(kLayer1Shard, [&](ojson& j) { j.erase(name); });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("places tensor " + name + " in " + kLayer1Shard),
                                 HasSubstr("does not list it")));
}

TEST_F(CheckpointTest, ExpertPartWithTheWrongShape) {
  EditHeader(kLayer1Shard, [](ojson& j) {
    j["language_model.model.layers.1.block_sparse_moe.experts.4.w1.weight_scale"]["shape"] = {2,
                                                                                              64};
  });
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("experts.4.w1.weight_scale has shape [2, 64], expected "
                                           "[64, 2]"),
                                 HasSubstr(Path(kLayer1Shard))));
}

// The first part-like name seen decides which prefix gets slots; when the embedding says the
// other one, the parts move over, and the stray tensor stays an ordinary one.
TEST_F(CheckpointTest, APartLikeNameUnderAnotherPrefixSeenFirst) {
  auto before = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(before.ok());
  const std::string stray = "model.layers.1.block_sparse_moe.experts.0.w1.weight_packed";
  AddTensorFirst("model-00001-of-00014.safetensors", stray, {64, 32});
  auto ckpt = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const Checkpoint& c = **ckpt;
  EXPECT_EQ(c.tensors().size(), 917u);
  const TensorInfo* t = c.Find(stray);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shard, 0);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{64, 32}));
  std::vector<uint8_t> bytes(t->byte_size);
  ASSERT_TRUE(c.ReadTensor(*t, bytes).ok());
  EXPECT_EQ(bytes[0], 0x11);
  for (int64_t e = 0; e < 8; ++e) {
    const ExpertLocation& a = c.expert(1, e);
    const ExpertLocation& b = (*before)->expert(1, e);
    ASSERT_EQ(a.spans.size(), 1u);
    EXPECT_EQ(a.spans[0].offset, b.spans[0].offset);
    EXPECT_EQ(a.spans[0].shard, b.spans[0].shard);
    EXPECT_EQ(a.part_offset, b.part_offset);
  }
  EXPECT_NE(c.Find(c.names().Expert(1, 0, 0)), nullptr);
}

TEST_F(CheckpointTest, MissingConfigIsNotFound) {
  std::filesystem::remove(Path("config.json"));
  EXPECT_THAT(OpenError(), HasSubstr(Path("config.json")));
  EXPECT_EQ(OpenCode(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, DirectoryWithoutWeights) {
  std::filesystem::remove(Path("model.safetensors.index.json"));
  EXPECT_THAT(OpenError(), HasSubstr("neither model.safetensors nor model.safetensors.index.json"));
}

TEST_F(CheckpointTest, MissingDirectory) {
  auto ckpt = Checkpoint::Open(dir_ / "nope");
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(ckpt.status().message()), HasSubstr("nope does not exist"));
}

}  // namespace
}  // namespace k3
