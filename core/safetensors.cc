#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

using json = nlohmann::json;

absl::Status Corrupt(std::string_view file, std::string_view what) {
  return absl::DataLossError(
      absl::StrCat(std::string(file), ": corrupt safetensors header: ", std::string(what)));
}

bool ParseDType(const std::string& s, DType* out) {
  if (s == "BF16")
    *out = DType::kBF16;
  else if (s == "F16")
    *out = DType::kF16;
  else if (s == "F32")
    *out = DType::kF32;
  else if (s == "U8")
    *out = DType::kU8;
  else
    return false;
  return true;
}

// Parses one entry {dtype, shape, data_offsets}; offsets are relative to the data section.
absl::Status ParseEntry(const std::string& name, const json& entry, uint64_t data_start,
                        uint64_t file_size, const std::string& file, TensorInfo* out) {
  auto where = [&](const std::string& what) {
    return Corrupt(file, absl::StrCat(name, ": ", what));
  };
  if (!entry.is_object()) return where("entry is not an object");
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) return where("missing dtype");
  if (!ParseDType(dtype->get<std::string>(), &out->dtype)) {
    return absl::DataLossError(absl::StrCat(file, ": tensor ", name, " has unsupported dtype ",
                                            dtype->dump(), " (supported: BF16, F16, F32, U8)"));
  }
  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) return where("missing shape");
  out->shape.clear();
  uint64_t elements = 1;
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) return where(absl::StrCat("bad shape ", shape->dump()));
    uint64_t v = d.get<uint64_t>();
    if (v != 0 && elements > (1ull << 48) / v) return where("shape too large");
    elements *= v;
    out->shape.push_back(static_cast<int64_t>(v));
  }
  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return where("data_offsets must be two non-negative integers");
  }
  uint64_t begin = (*offsets)[0].get<uint64_t>();
  uint64_t end = (*offsets)[1].get<uint64_t>();
  if (end < begin) {
    return where(absl::StrCat("data_offsets out of order [", begin, ", ", end, ")"));
  }
  if (end > file_size - data_start) {
    return where(absl::StrCat("data_offsets [", begin, ", ", end,
                              ") run past the end of the file (", file_size - data_start,
                              " data bytes)"));
  }
  if (end - begin != elements * DTypeSize(out->dtype)) {
    return where(absl::StrCat("holds ", end - begin, " bytes but shape ", shape->dump(), " of ",
                              DTypeName(out->dtype), " needs ", elements * DTypeSize(out->dtype)));
  }
  out->name = name;
  out->file_offset = data_start + begin;
  out->byte_size = end - begin;
  return absl::OkStatus();
}

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
    case DType::kU8:
      return 1;
  }
  return 1;
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<uint64_t> ParseHeaderLength(const uint8_t prefix[8], uint64_t file_size,
                                           std::string_view file_name) {
  if (file_size < 8) {
    return Corrupt(file_name, absl::StrCat("file is ", file_size,
                                           " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > kMaxHeaderBytes) {
    return Corrupt(file_name,
                   absl::StrCat("header length ", n, " is absurd (limit ", kMaxHeaderBytes, ")"));
  }
  if (n > file_size - 8) {
    return Corrupt(file_name, absl::StrCat("header length ", n, " runs past the end of the file (",
                                           file_size, " bytes)"));
  }
  return n;
}

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(std::string_view header_json,
                                                               uint64_t file_size, int shard,
                                                               std::string_view file_name) {
  // Duplicate names are legal JSON but ambiguous weights: catch them while parsing, since the
  // parsed object keeps only one of them.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_key = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json root = json::parse(header_json.begin(), header_json.end(), on_key, false);
  if (root.is_discarded()) return Corrupt(file_name, "header is not valid JSON");
  if (!root.is_object()) return Corrupt(file_name, "header JSON is not an object");
  if (!duplicate.empty()) {
    return Corrupt(file_name, absl::StrCat("tensor ", duplicate, " is listed twice"));
  }
  const uint64_t data_start = 8 + header_json.size();
  std::vector<TensorInfo> tensors;
  tensors.reserve(root.size());
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") continue;
    TensorInfo info;
    info.shard = shard;
    absl::Status s = ParseEntry(name, entry, data_start, file_size, std::string(file_name), &info);
    if (!s.ok()) return s;
    tensors.push_back(std::move(info));
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.file_offset < b.file_offset ||
           (a.file_offset == b.file_offset && a.byte_size < b.byte_size);
  });
  for (size_t i = 1; i < tensors.size(); ++i) {
    const TensorInfo& prev = tensors[i - 1];
    if (tensors[i].file_offset < prev.file_offset + prev.byte_size) {
      return Corrupt(file_name, absl::StrCat("tensors ", prev.name, " and ", tensors[i].name,
                                             " overlap at file offset ", tensors[i].file_offset));
    }
  }
  return tensors;
}

std::string BuildSafetensorsHeader(const std::vector<TensorInfo>& tensors) {
  json root = json::object();
  uint64_t offset = 0;
  // ordered_json keeps the file order readable (by offset); plain json would sort by name.
  nlohmann::ordered_json ordered = nlohmann::ordered_json::object();
  for (const TensorInfo& t : tensors) {
    ordered[t.name] = {{"dtype", DTypeName(t.dtype)},
                       {"shape", t.shape},
                       {"data_offsets", {offset, offset + t.byte_size}}};
    offset += t.byte_size;
  }
  std::string text = ordered.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace k3
