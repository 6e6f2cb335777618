#include "core/text/tools/python_json.h"

#include <charconv>
#include <cmath>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

// Python's float repr: the shortest digits that round-trip, in fixed notation when the
// decimal point falls within 16 digits (with at least ".0"), else d.ddde±XX.
std::string FloatRepr(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view s(buf, r.ptr - buf);
  std::string out;
  if (s.front() == '-') {
    out = "-";
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits(s.substr(0, e));
  if (digits.size() > 1) digits.erase(1, 1);  // the '.' after the first digit
  int exponent = 0;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+'), s.data() + s.size(), exponent);
  const int point = exponent + 1;  // digits before the decimal point
  const int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) return absl::StrCat(out, "0.", std::string(-point, '0'), digits);
    if (point >= n) return absl::StrCat(out, digits, std::string(point - n, '0'), ".0");
    return absl::StrCat(out, digits.substr(0, point), ".", digits.substr(point));
  }
  absl::StrAppend(&out, digits.substr(0, 1));
  if (n > 1) absl::StrAppend(&out, ".", digits.substr(1));
  const int magnitude = std::abs(exponent);
  absl::StrAppend(&out, "e", exponent < 0 ? "-" : "+", magnitude < 10 ? "0" : "", magnitude);
  return out;
}

std::string QuotedString(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', /*ensure_ascii=*/false,
                                nlohmann::json::error_handler_t::replace);
}

template <typename Json>
void Dump(const Json& v, bool compact, std::string& out) {
  const char* comma = compact ? "," : ", ";
  const char* colon = compact ? ":" : ": ";
  switch (v.type()) {
    case nlohmann::json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += comma;
        first = false;
        absl::StrAppend(&out, QuotedString(it.key()), colon);
        Dump(it.value(), compact, out);
      }
      out += '}';
      return;
    }
    case nlohmann::json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += comma;
        Dump(v[i], compact, out);
      }
      out += ']';
      return;
    }
    case nlohmann::json::value_t::string:
      out += QuotedString(v.template get<std::string>());
      return;
    case nlohmann::json::value_t::number_float:
      out += FloatRepr(v.template get<double>());
      return;
    default:  // integers, booleans, null: as nlohmann writes them
      out += v.dump();
      return;
  }
}

// Reads one JSON value at the start of a text with the library's SAX parser and reports where
// it ends: the parser is not strict about what follows, and an iterator that notes the
// furthest character read gives the end (a number is only known to end one character later).
class ValueReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  struct Iterator {
    using iterator_category = std::input_iterator_tag;
    using value_type = char;
    using difference_type = std::ptrdiff_t;
    using pointer = const char*;
    using reference = const char&;
    const char* at;
    const char** furthest;
    reference operator*() const {
      if (at + 1 > *furthest) *furthest = at + 1;
      return *at;
    }
    Iterator& operator++() {
      ++at;
      return *this;
    }
    Iterator operator++(int) {
      Iterator old = *this;
      ++at;
      return old;
    }
    bool operator==(const Iterator& o) const { return at == o.at; }
    bool operator!=(const Iterator& o) const { return at != o.at; }
  };

  // The length of the value at the start of `text`, or 0 when there is none.
  size_t Read(std::string_view text) {
    const char* furthest = text.data();
    Iterator first{text.data(), &furthest}, last{text.data() + text.size(), &furthest};
    if (!nlohmann::json::sax_parse(first, last, this, nlohmann::json::input_format_t::json,
                                   /*strict=*/false)) {
      return 0;
    }
    size_t length = static_cast<size_t>(furthest - text.data());
    if (type == "number" && length < text.size() + 1 && IsNumberEnd(text, length)) --length;
    return length;
  }

  std::string type;     // of the top-level value (its XTML type)
  std::string decoded;  // a top-level string

  bool null() override { return Scalar("null"); }
  bool boolean(bool) override { return Scalar("boolean"); }
  bool number_integer(number_integer_t) override { return Scalar("number"); }
  bool number_unsigned(number_unsigned_t) override { return Scalar("number"); }
  bool number_float(number_float_t, const string_t&) override { return Scalar("number"); }
  bool string(string_t& s) override {
    if (depth_ == 0) decoded = s;
    return Scalar("string");
  }
  bool binary(binary_t&) override { return Scalar("array"); }
  bool start_object(std::size_t) override { return Open("object"); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open("array"); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  // The lexer read one character past a number unless the text ended right after it.
  static bool IsNumberEnd(std::string_view text, size_t length) {
    return length > text.size() || !(std::isdigit(static_cast<unsigned char>(text[length - 1])));
  }
  bool Scalar(const char* t) {
    if (depth_ == 0) type = t;
    return true;
  }
  bool Open(const char* t) {
    if (depth_++ == 0) type = t;
    return true;
  }
  bool Close() {
    --depth_;
    return true;
  }
  int depth_ = 0;
};

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  return i;
}

}  // namespace

std::string PythonJsonDumps(const nlohmann::json& value, bool compact) {
  std::string out;
  Dump(value, compact, out);
  return out;
}

std::string PythonJsonDumps(const nlohmann::ordered_json& value, bool compact) {
  std::string out;
  Dump(value, compact, out);
  return out;
}

std::optional<std::vector<ArgumentPair>> ParseArgumentsOneLevel(std::string_view text) {
  size_t i = SkipSpace(text, 0);
  if (i == text.size() || text[i] != '{') return std::nullopt;
  std::vector<ArgumentPair> pairs;
  i = SkipSpace(text, i + 1);
  if (i < text.size() && text[i] == '}') return pairs;
  while (true) {
    ValueReader key;
    const size_t key_length = key.Read(text.substr(i));
    if (key_length == 0 || key.type != "string") return std::nullopt;
    i = SkipSpace(text, i + key_length);
    if (i == text.size() || text[i] != ':') return std::nullopt;
    i = SkipSpace(text, i + 1);
    ValueReader value;
    const size_t value_length = value.Read(text.substr(i));
    if (value_length == 0) return std::nullopt;
    pairs.push_back(
        {key.decoded,
         value.type == "string" ? value.decoded : std::string(text.substr(i, value_length)),
         value.type});
    i = SkipSpace(text, i + value_length);
    if (i == text.size()) return std::nullopt;
    if (text[i] == '}') return pairs;
    if (text[i] != ',') return std::nullopt;
    i = SkipSpace(text, i + 1);
  }
}

}  // namespace k3
