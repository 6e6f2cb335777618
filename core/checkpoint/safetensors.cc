#include "core/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint/json_reader.h"
#include "core/util/absl_compat.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

namespace od = simdjson::ondemand;
using simdjson::error_code;
using tokenizer_internal::Av;

absl::Status Corrupt(std::string_view file, std::string_view what) {
  return absl::DataLossError(absl::StrCat(Av(file), ": corrupt safetensors header: ", Av(what)));
}

bool ParseDType(std::string_view s, DType* out) {
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

// State reused from entry to entry, so that a header costs no allocation per tensor.
struct EntryScratch {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> values;
  std::vector<int64_t> shape;
};

absl::Status Invalid(JsonReader& reader, od::document& doc, std::string_view file,
                     error_code error) {
  // Valid JSON, for nlohmann, which has no limit; refused all the same.
  if (error == simdjson::DEPTH_ERROR) {
    return Corrupt(file, absl::StrCat("header nests values more than ", JsonReader::kMaxDepth,
                                      " levels deep (", reader.Describe(error, doc), ")"));
  }
  return Corrupt(file,
                 absl::StrCat("header is not valid JSON (", reader.Describe(error, doc), ")"));
}

// Reads an array into `values`; *first_bad is the position of the first element that is not
// a non-negative integer (elements of other types are validated and skipped), or
// values.size() if there is none.
error_code ReadUnsignedArray(JsonReader& reader, od::value value, std::vector<uint64_t>& values,
                             size_t* first_bad) {
  values.clear();
  *first_bad = SIZE_MAX;
  od::array array;
  if (error_code e = value.get_array().get(array)) return e;
  for (auto element : array) {
    od::value v;
    od::json_type type;
    if (error_code e = std::move(element).get(v)) return e;
    if (error_code e = v.type().get(type)) return e;
    uint64_t x = 0;
    bool is_unsigned = false;
    if (type == od::json_type::number) {
      // What is not a 64-bit unsigned integer (a negative, a fraction, an exponent, 2^64) must
      // still be a valid number.
      is_unsigned = !v.get_uint64().get(x);
      if (!is_unsigned) {
        if (error_code e = reader.CheckNumber(v)) return e;
      }
    } else if (error_code e = reader.Skip(v)) {
      return e;
    }
    if (!is_unsigned && *first_bad == SIZE_MAX) *first_bad = values.size();
    values.push_back(x);
  }
  *first_bad = std::min(*first_bad, values.size());
  return simdjson::SUCCESS;
}

// Reads one entry {dtype, shape, data_offsets} (other keys are validated and skipped) named
// s.name and checks it on its own; offsets in the file are relative to the data section at
// `data_start`.
absl::Status ReadEntry(JsonReader& reader, od::document& doc, od::value value, uint64_t data_start,
                       uint64_t file_size, std::string_view file, EntryScratch& s,
                       TensorEntry* out) {
  const std::string& name = s.name;
  auto where = [&](std::string_view what) {
    return Corrupt(file, absl::StrCat(Av(name), ": ", Av(what)));
  };
  od::json_type type;
  if (error_code e = value.type().get(type)) return Invalid(reader, doc, file, e);
  if (type != od::json_type::object) {
    if (error_code e = reader.Skip(value)) return Invalid(reader, doc, file, e);
    return where("entry is not an object");
  }
  od::object object;
  if (error_code e = value.get_object().get(object)) return Invalid(reader, doc, file, e);
  // Later keys win, as in a parsed JSON object.
  bool has_dtype = false, has_shape = false, shape_ok = false, has_offsets = false;
  uint64_t offsets[2] = {0, 0};
  size_t bad_dim = 0;
  enum Key { kOther, kDType, kShape, kOffsets };
  for (auto member : object) {
    od::field field;
    std::string_view key_text;
    error_code e = reader.Member(std::move(member), field, key_text, type);
    if (e) return Invalid(reader, doc, file, e);
    const Key key = key_text == "dtype"          ? kDType
                    : key_text == "shape"        ? kShape
                    : key_text == "data_offsets" ? kOffsets
                                                 : kOther;
    od::value v = field.value();
    if (key == kDType && type == od::json_type::string) {
      std::string_view dtype;
      e = reader.String(v, dtype);
      s.dtype.assign(dtype);
      has_dtype = true;
    } else if (key == kShape && type == od::json_type::array) {
      has_shape = true;
      e = ReadUnsignedArray(reader, v, s.values, &bad_dim);
      shape_ok = bad_dim == s.values.size();
      s.shape.clear();
      for (uint64_t d : s.values) {
        s.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(d, INT64_MAX)));
      }
    } else if (key == kOffsets && type == od::json_type::array) {
      size_t first_bad = 0;
      e = ReadUnsignedArray(reader, v, s.values, &first_bad);
      has_offsets = first_bad == 2 && s.values.size() == 2;
      if (has_offsets) {
        offsets[0] = s.values[0];
        offsets[1] = s.values[1];
      }
    } else {
      if (key == kDType) has_dtype = false;
      if (key == kShape) has_shape = false;
      if (key == kOffsets) has_offsets = false;
      e = reader.Skip(v);
    }
    if (e) return Invalid(reader, doc, file, e);
  }
  if (!has_dtype) return where("missing dtype");
  if (!ParseDType(s.dtype, &out->dtype)) {
    return absl::DataLossError(absl::StrCat(Av(file), ": tensor ", Av(name),
                                            " has unsupported dtype ", JsonQuote(s.dtype),
                                            " (supported: BF16, F16, F32, U8)"));
  }
  if (!has_shape) return where("missing shape");
  if (!shape_ok) {
    return where(absl::StrCat("bad shape: dimension ", bad_dim, " is not a non-negative integer"));
  }
  uint64_t elements = 1;
  for (int64_t d : s.shape) {
    const uint64_t v = static_cast<uint64_t>(d);
    if (v != 0 && elements > (1ull << 48) / v) return where("shape too large");
    elements *= v;
  }
  if (!has_offsets) return where("data_offsets must be two non-negative integers");
  const uint64_t begin = offsets[0], end = offsets[1];
  if (end < begin) {
    return where(absl::StrCat("data_offsets out of order [", begin, ", ", end, ")"));
  }
  if (end > file_size - data_start) {
    return where(absl::StrCat("data_offsets [", begin, ", ", end,
                              ") run past the end of the file (", file_size - data_start,
                              " data bytes)"));
  }
  const uint64_t need = elements * DTypeSize(out->dtype);
  if (end - begin != need) {
    return where(absl::StrCat("holds ", end - begin, " bytes but shape ", ShapeText(s.shape),
                              " of ", DTypeName(out->dtype), " needs ", need));
  }
  out->name = name;
  out->shape = s.shape;
  out->file_offset = data_start + begin;
  out->byte_size = end - begin;
  return absl::OkStatus();
}

// Where each tensor's bytes are, by its position in the header (for the overlap check).
struct Extent {
  uint64_t offset;
  uint64_t size;
  size_t ordinal;
};

// One pass over the header in `reader` (`length` bytes after the prefix): every entry checked
// and handed to `sink` (when not null), their extents collected when `extents` is not null,
// and names at `want` ordinals (sorted) copied.
absl::Status Pass(JsonReader& reader, uint64_t length, uint64_t file_size, std::string_view file,
                  SafetensorsSink* sink, bool* in_order, std::vector<Extent>* extents,
                  std::vector<std::pair<size_t, std::string>>* want) {
  od::document doc;
  od::json_type type;
  error_code e = reader.Start(doc);
  if (!e) e = doc.type().get(type);
  if (e) return Invalid(reader, doc, file, e);
  if (type != od::json_type::object) {
    if ((e = reader.SkipDocument(doc))) return Invalid(reader, doc, file, e);
    return Corrupt(file, "header JSON is not an object");
  }
  const uint64_t data_start = 8 + length;
  EntryScratch scratch;
  TensorEntry entry;
  size_t ordinal = 0;
  uint64_t last_end = 0;
  auto wanted =
      want != nullptr ? want->begin() : std::vector<std::pair<size_t, std::string>>::iterator();
  od::object root;
  if ((e = doc.get_object().get(root))) return Invalid(reader, doc, file, e);
  for (auto member : root) {
    od::field field;
    std::string_view name;
    if ((e = reader.Member(std::move(member), field, name, type))) {
      return Invalid(reader, doc, file, e);
    }
    if (name == "__metadata__") {
      if ((e = reader.Skip(field.value()))) return Invalid(reader, doc, file, e);
      continue;
    }
    scratch.name.assign(name);
    if (absl::Status s =
            ReadEntry(reader, doc, field.value(), data_start, file_size, file, scratch, &entry);
        !s.ok()) {
      return s;
    }
    if (sink != nullptr) {
      if (absl::Status s = sink->Add(entry); !s.ok()) return s;
    }
    if (in_order != nullptr) {
      // Writers list tensors by offset: then one comparison per tensor proves them disjoint.
      if (entry.file_offset < last_end) *in_order = false;
      last_end = std::max(last_end, entry.file_offset + entry.byte_size);
    }
    if (extents != nullptr) extents->push_back({entry.file_offset, entry.byte_size, ordinal});
    if (want != nullptr && wanted != want->end() && wanted->first == ordinal) {
      (wanted++)->second = scratch.name;
    }
    ++ordinal;
  }
  if ((e = reader.Finish(doc))) return Invalid(reader, doc, file, e);
  return absl::OkStatus();
}

}  // namespace

std::string ShapeText(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

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

absl::Status ScanSafetensorsHeader(const HeaderSource& header, uint64_t file_size,
                                   std::string_view file_name, SafetensorsSink& sink) {
  JsonReader own;
  JsonReader& reader = header.reader() != nullptr ? *header.reader() : own;
  if (absl::Status s = header.file() != nullptr ? reader.Load(*header.file(), 8, header.length())
                                                : reader.Load(header.json());
      !s.ok()) {
    return s;
  }
  const uint64_t length = header.length();
  bool in_order = true;
  if (absl::Status s =
          Pass(reader, length, file_size, file_name, &sink, &in_order, nullptr, nullptr);
      !s.ok() || in_order) {
    return s;
  }
  // Listed out of offset order: a second pass collects every extent to sort.
  std::vector<Extent> extents;
  if (absl::Status s =
          Pass(reader, length, file_size, file_name, nullptr, nullptr, &extents, nullptr);
      !s.ok()) {
    return s;
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.offset < b.offset || (a.offset == b.offset && a.size < b.size);
  });
  for (size_t i = 1; i < extents.size(); ++i) {
    const Extent& prev = extents[i - 1];
    if (extents[i].offset >= prev.offset + prev.size) continue;
    // Names only now, for the message: a third pass finds the two.
    std::vector<std::pair<size_t, std::string>> names = {{prev.ordinal, ""},
                                                         {extents[i].ordinal, ""}};
    const bool swapped = names[0].first > names[1].first;
    if (swapped) std::swap(names[0], names[1]);
    (void)Pass(reader, length, file_size, file_name, nullptr, nullptr, nullptr, &names);
    if (swapped) std::swap(names[0], names[1]);
    return Corrupt(file_name, absl::StrCat("tensors ", names[0].second, " and ", names[1].second,
                                           " overlap at file offset ", extents[i].offset));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(std::string_view header_json,
                                                               uint64_t file_size, int shard,
                                                               std::string_view file_name) {
  class Collect : public SafetensorsSink {
   public:
    Collect(int shard, std::string_view file) : shard_(shard), file_(file) {}
    absl::Status Add(const TensorEntry& e) override {
      if (!seen_.emplace(e.name).second) {
        return Corrupt(file_, absl::StrCat("tensor ", Av(e.name), " is listed twice"));
      }
      tensors.push_back({std::string(e.name),
                         e.dtype,
                         {e.shape.begin(), e.shape.end()},
                         shard_,
                         e.file_offset,
                         e.byte_size});
      return absl::OkStatus();
    }
    std::vector<TensorInfo> tensors;

   private:
    int shard_;
    std::string_view file_;
    std::set<std::string, std::less<>> seen_;
  };
  Collect collect(shard, file_name);
  if (absl::Status s =
          ScanSafetensorsHeader(HeaderSource(header_json), file_size, file_name, collect);
      !s.ok()) {
    return s;
  }
  std::sort(collect.tensors.begin(), collect.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return a.file_offset < b.file_offset ||
                     (a.file_offset == b.file_offset && a.byte_size < b.byte_size);
            });
  return std::move(collect.tensors);
}

std::string JsonQuote(std::string_view s) {
  bool plain = true;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    plain = plain && u >= 0x20 && u < 0x80 && c != '"' && c != '\\';
  }
  if (plain) return absl::StrCat("\"", Av(s), "\"");
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string BuildSafetensorsHeader(const std::vector<TensorInfo>& tensors) {
  std::string text = "{";
  uint64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    if (text.size() > 1) text += ',';
    absl::StrAppend(&text, JsonQuote(t.name), ":{\"dtype\":\"", DTypeName(t.dtype),
                    "\",\"shape\":[", absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset,
                    ",", offset + t.byte_size, "]}");
    offset += t.byte_size;
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace k3
