// Shared by the grammar tests: a turn's output symbols parsed into think, response and calls
// (TOOLS.md section 10), and a test-only validator of the JSON-schema keywords json_schema.h
// supports.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "core/text/grammar/grammar.h"
#include "core/text/grammar/token_mask.h"
#include "nlohmann/json.hpp"

namespace k3::grammar::testing {

using Json = nlohmann::ordered_json;

// Integers past 64 bits parse as floats.
inline bool IsInteger(const Json& v) {
  return v.is_number_integer() ||
         (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
}

// A test-only validator of the supported keywords (json_schema.h), with its semantics: without
// `additionalProperties`, declared properties are the only ones (none declared: any).
inline bool Valid(const Json& v, const Json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("anyOf") || s.contains("oneOf")) {
    const Json& subs = s.contains("anyOf") ? s["anyOf"] : s["oneOf"];
    return std::any_of(subs.begin(), subs.end(), [&](const Json& sub) { return Valid(v, sub); });
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) {
    return false;
  }
  if (s.contains("type")) {
    Json types = s["type"].is_array() ? s["type"] : Json::array({s["type"]});
    bool ok = false;
    for (const Json& t : types) {
      const std::string name = t;
      ok |= (name == "string" && v.is_string()) || (name == "number" && v.is_number()) ||
            (name == "integer" && IsInteger(v)) || (name == "boolean" && v.is_boolean()) ||
            (name == "null" && v.is_null()) || (name == "object" && v.is_object()) ||
            (name == "array" && v.is_array());
    }
    if (!ok) return false;
  }
  if (v.is_object()) {
    const Json props = s.value("properties", Json::object());
    for (const Json& r : s.value("required", Json::array())) {
      if (!v.contains(r.get<std::string>())) return false;
    }
    const Json extra = s.value("additionalProperties", Json(!s.contains("properties")));
    for (const auto& [k, value] : v.items()) {
      const Json& sub = props.contains(k) ? props[k] : extra;
      if (!Valid(value, sub)) return false;
    }
  }
  if (v.is_array()) {
    if (v.size() < s.value("minItems", 0u) || v.size() > s.value("maxItems", 1000000u)) {
      return false;
    }
    for (const Json& item : v) {
      if (!Valid(item, s.value("items", Json(true)))) return false;
    }
  }
  return true;
}

// nlohmann refuses numbers past a double's range (random digits reach 1e1234564), which are
// valid JSON: exponents become e0, which changes no type.
inline Json ParseJson(const std::string& text) {
  static const std::regex kExponent("([0-9])[eE][-+]?[0-9]+");
  return Json::parse(std::regex_replace(text, kExponent, "$1e0"), nullptr, false);
}

// A turn's output, parsed from its symbols (markers are specials, TOOLS.md section 10).
struct Turn {
  std::string think, response;
  struct Call {
    std::string tool;
    Json arguments = Json::object();
  };
  std::vector<Call> calls;
  bool ended = false;
};

inline std::string Attr(const std::string& header, const std::string& key) {
  const size_t at = header.find(" " + key + "=\"");
  if (at == std::string::npos) return "";
  const size_t from = at + key.size() + 3;
  std::string v = header.substr(from, header.find('"', from) - from);
  for (auto [esc, c] : {std::pair{"&quot;", "\""}, std::pair{"&amp;", "&"}}) {
    for (size_t p; (p = v.find(esc)) != std::string::npos;) v.replace(p, strlen(esc), c);
  }
  return v;
}

inline Turn ParseTurn(const std::vector<int>& symbols, bool thinking) {
  Turn turn;
  std::string text, header, key, type;
  std::string* body = thinking ? &turn.think : &turn.response;
  for (size_t i = 0; i < symbols.size(); ++i) {
    const int s = symbols[i];
    if (s < 256) {
      text += static_cast<char>(s);
      continue;
    }
    if (s == kEndOfMsg) {
      turn.ended = true;
      continue;
    }
    // A marker: the text before it is a body; its header runs to <|sep|>.
    const std::string before = std::exchange(text, "");
    header.clear();
    for (++i; i < symbols.size() && symbols[i] != kSep; ++i)
      header += static_cast<char>(symbols[i]);
    const std::string tag = header.substr(0, header.find(' '));
    if (s == kOpen && tag == "response") body = &turn.response;
    if (s == kOpen && tag == "call") turn.calls.push_back({Attr(header, "tool")});
    if (s == kOpen && tag == "argument") key = Attr(header, "key"), type = Attr(header, "type");
    if (s == kClose && (tag == "think" || tag == "response")) *body = before;
    if (s == kClose && tag == "argument") {
      turn.calls.back().arguments[key] = type == "string" ? Json(before) : ParseJson(before);
    }
  }
  return turn;
}

// Sampled ids as the grammar's symbols: a special as its one symbol, any other id as its bytes.
inline std::vector<int> IdSymbols(const TokenTrie& trie, const std::vector<int32_t>& ids) {
  std::vector<int> symbols;
  for (const int32_t id : ids) {
    if (trie.symbol(id) >= kEndOfMsg) {
      symbols.push_back(trie.symbol(id));
    } else {
      for (const char ch : trie.bytes(id)) symbols.push_back(static_cast<unsigned char>(ch));
    }
  }
  return symbols;
}

}  // namespace k3::grammar::testing
