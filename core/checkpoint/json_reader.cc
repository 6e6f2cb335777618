#include "core/checkpoint/json_reader.h"

#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace k3 {

using simdjson::error_code;
namespace od = simdjson::ondemand;

namespace {
// Documents from this size on go into huge pages; below it the 2 MiB that a huge page zeroes
// cost more than the 4 KiB faults they save.
constexpr size_t kHugePagesFrom = 1 << 20;
}  // namespace

absl::Status JsonReader::Reserve(uint64_t length) {
  if (length > SIZE_MAX - 2 * simdjson::SIMDJSON_PADDING) {
    return absl::ResourceExhaustedError(absl::StrCat("a JSON document of ", length, " bytes"));
  }
  const size_t need = static_cast<size_t>(length) + simdjson::SIMDJSON_PADDING;
  if (capacity_ < need) {
    buffer_.reset();
    small_.reset();
    capacity_ = 0;
    if (need >= kHugePagesFrom) {
      auto buffer = io::BufferArena::Create(need);
      if (!buffer.ok()) return buffer.status();
      buffer_ = *std::move(buffer);
    } else {
      small_.reset(new (std::nothrow) uint8_t[need]);
      if (small_ == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", need, " bytes"));
      }
    }
    capacity_ = need;
  }
  if (scratch_size_ < need) {
    scratch_.reset(new (std::nothrow) uint8_t[need]);
    scratch_size_ = scratch_ == nullptr ? 0 : need;
    if (scratch_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", need, " bytes"));
    }
  }
  return absl::OkStatus();
}

void JsonReader::Seal(uint64_t length) {
  const void* nul = std::memchr(data(), '\0', length);
  const size_t end =
      nul == nullptr ? length : static_cast<size_t>(static_cast<const uint8_t*>(nul) - data());
  // nlohmann skips a UTF-8 byte order mark; simdjson would call it invalid.
  begin_ = end >= 3 && std::memcmp(data(), "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
  length_ = end - begin_;
  // The padding is never part of the document, but a number at the very end is read up to
  // the first byte that cannot continue it.
  std::memset(data() + end, ' ', simdjson::SIMDJSON_PADDING);
}

absl::Status JsonReader::Load(const io::RandomAccessFile& file, uint64_t offset, uint64_t length) {
  if (absl::Status s = Reserve(length); !s.ok()) return s;
  if (absl::Status s = file.ReadAt(offset, {data(), static_cast<size_t>(length)}); !s.ok()) {
    return s;
  }
  Seal(length);
  return absl::OkStatus();
}

absl::Status JsonReader::Load(std::string_view text) {
  if (absl::Status s = Reserve(text.size()); !s.ok()) return s;
  if (!text.empty()) std::memcpy(data(), text.data(), text.size());
  Seal(text.size());
  return absl::OkStatus();
}

error_code JsonReader::Start(od::document& doc) {
  started_ = false;
  if (data() == nullptr) return simdjson::EMPTY;
  const error_code e = parser_
                           .iterate(simdjson::padded_string_view(
                               text().data(), length_, length_ + simdjson::SIMDJSON_PADDING))
                           .get(doc);
  started_ = !e;
  return e;
}

error_code JsonReader::String(od::raw_json_string raw, std::string_view& out) {
  uint8_t* dst = scratch_.get();
  return parser_.unescape(raw, dst).get(out);
}

error_code JsonReader::String(od::value& value, std::string_view& out) {
  od::raw_json_string raw;
  if (error_code e = value.get_raw_json_string().get(raw)) return e;
  return String(raw, out);
}

error_code JsonReader::Member(simdjson::simdjson_result<od::field> member, od::field& field,
                              std::string_view& key, od::json_type& type) {
  if (error_code e = std::move(member).get(field)) return e;
  if (error_code e = String(field.key(), key)) return e;
  return field.value().type().get(type);
}

error_code JsonReader::CheckNumber(od::value& value) {
  // A double takes every valid number (an integer past 64 bits too) and refuses one that
  // overflows, as nlohmann does.
  const error_code e = value.get_double().error();
  if (e != simdjson::NUMBER_ERROR) return e;
  // simdjson 3.0 also refuses an exponent beyond its range where the value is finite
  // (0e99999999999999999999, 1e-99999999999999999999); nlohmann takes them. Such a number is
  // left for the enclosing array or object to step over.
  return nlohmann::json::accept(value.raw_json_token()) ? simdjson::SUCCESS : e;
}

error_code JsonReader::SkipAt(od::value value, int depth) {
  if (depth > kMaxDepth) return simdjson::DEPTH_ERROR;
  od::json_type type;
  if (error_code e = value.type().get(type)) return e;
  switch (type) {
    case od::json_type::object: {
      od::object object;
      if (error_code e = value.get_object().get(object)) return e;
      for (auto member : object) {
        od::field field;
        std::string_view key;
        if (error_code e = Member(std::move(member), field, key, type)) return e;
        if (error_code e = SkipAt(field.value(), depth + 1)) return e;
      }
      return simdjson::SUCCESS;
    }
    case od::json_type::array: {
      od::array array;
      if (error_code e = value.get_array().get(array)) return e;
      for (auto element : array) {
        od::value v;
        if (error_code e = std::move(element).get(v)) return e;
        if (error_code e = SkipAt(v, depth + 1)) return e;
      }
      return simdjson::SUCCESS;
    }
    case od::json_type::string: {
      std::string_view s;
      return String(value, s);
    }
    case od::json_type::number:
      return CheckNumber(value);
    case od::json_type::boolean:
      return value.get_bool().error();
    case od::json_type::null: {
      bool null = false;
      if (error_code e = value.is_null().get(null)) return e;
      return null ? simdjson::SUCCESS : simdjson::N_ATOM_ERROR;
    }
  }
  return simdjson::TAPE_ERROR;
}

error_code JsonReader::SkipDocument(od::document& doc) {
  od::json_type type;
  if (error_code e = doc.type().get(type)) return e;
  if (type == od::json_type::object || type == od::json_type::array) {
    od::value value;
    error_code e = doc.get_value().get(value);
    if (!e) e = SkipAt(value, 1);
    return e ? e : Finish(doc);
  }
  // A lone scalar is never a header or an index, so its validity only chooses the message.
  // nlohmann, which decided before, decides: simdjson 3.0 takes "nullx" for a top-level null.
  if (nlohmann::json::accept(text())) return simdjson::SUCCESS;
  error_code e = simdjson::SUCCESS;
  switch (type) {
    case od::json_type::string:
      e = doc.get_string().error();
      break;
    case od::json_type::number:
      e = doc.get_double().error();
      break;
    case od::json_type::boolean:
      e = doc.get_bool().error();
      break;
    default:
      e = doc.is_null().error();
      break;
  }
  if (!e) e = Finish(doc);
  return e ? e : simdjson::TRAILING_CONTENT;  // the word, then more letters
}

error_code JsonReader::Finish(od::document& doc) {
  const char* at = nullptr;
  const error_code e = doc.current_location().get(at);
  if (e == simdjson::OUT_OF_BOUNDS) return simdjson::SUCCESS;  // past the last token
  return e ? e : simdjson::TRAILING_CONTENT;
}

std::string JsonReader::Describe(error_code error, od::document& doc) {
  // Errors of the first stage (UTF-8, an unclosed string, a control character) have no place.
  if (!started_) return simdjson::error_message(error);
  const char* at = nullptr;
  std::string where = "at the end";
  if (!doc.current_location().get(at) && at >= text().data() &&
      at <= text().data() + text().size()) {
    where = absl::StrCat("at byte ", at - reinterpret_cast<const char*>(data()));
  }
  return absl::StrCat(where, ": ", simdjson::error_message(error));
}

}  // namespace k3
