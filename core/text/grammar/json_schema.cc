#include "core/text/grammar/json_schema.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace k3::grammar {
namespace {

using Seq = GrammarBuilder::Seq;

constexpr std::string_view kAnnotations[] = {"description", "title",   "default",
                                             "examples",    "$schema", "strict"};
constexpr std::string_view kKeywords[] = {
    "type",     "properties", "required", "additionalProperties",
    "items",    "enum",       "const",    "minItems",
    "maxItems", "anyOf",      "oneOf"};
constexpr std::string_view kTypeNames[] = {"string", "number", "integer", "boolean",
                                           "null",   "object", "array"};
// minItems and maxItems unroll into one rule per item: a bound on the grammar's size.
constexpr int64_t kMaxItemsBound = 1024;

template <size_t N>
bool OneOf(std::string_view s, const std::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), s) != std::end(list);
}

absl::Status Refuse(std::string_view where, std::string_view what) {
  return absl::InvalidArgumentError(std::string(what) + " at " + std::string(where));
}

std::string Child(std::string_view where, std::string_view key) {
  return std::string(where) + "." + std::string(key);
}

std::string Index(std::string_view where, size_t i) {
  return absl::StrCat(std::string(where), "[", i, "]");
}

absl::Status CheckType(const Schema& type, std::string_view where) {
  auto known = [](const Schema& t) {
    return t.is_string() && OneOf(t.get_ref<const std::string&>(), kTypeNames);
  };
  if (known(type)) return absl::OkStatus();
  if (type.is_array() && !type.empty() && std::all_of(type.begin(), type.end(), known)) {
    return absl::OkStatus();
  }
  return Refuse(where, absl::StrCat("unsupported JSON-schema type ", type.dump()));
}

absl::Status CheckBound(const Schema& schema, std::string_view key, std::string_view where) {
  if (!schema.contains(key)) return absl::OkStatus();
  const Schema& v = schema.at(key);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > static_cast<uint64_t>(kMaxItemsBound)) {
    return Refuse(Child(where, key),
                  absl::StrCat(std::string(key), " must be an integer from 0 to ", kMaxItemsBound));
  }
  return absl::OkStatus();
}

absl::Status CheckObjectKeywords(const Schema& schema, std::string_view where) {
  if (schema.contains("properties")) {
    const Schema& props = schema.at("properties");
    const std::string at = Child(where, "properties");
    if (!props.is_object()) return Refuse(at, "properties must be an object");
    for (const auto& [name, sub] : props.items()) {
      if (absl::Status s = CheckSchema(sub, Child(at, name)); !s.ok()) return s;
    }
  }
  if (schema.contains("required")) {
    const Schema& required = schema.at("required");
    const std::string at = Child(where, "required");
    if (!required.is_array()) return Refuse(at, "required must be an array of property names");
    for (const Schema& name : required) {
      if (!name.is_string()) return Refuse(at, "required must be an array of property names");
      const Schema* props = schema.contains("properties") ? &schema.at("properties") : nullptr;
      if (props == nullptr || !props->contains(name.get_ref<const std::string&>())) {
        return Refuse(
            at, absl::StrCat("required property ", name.dump(), " is not declared in properties"));
      }
    }
  }
  if (schema.contains("additionalProperties")) {
    const Schema& extra = schema.at("additionalProperties");
    if (!extra.is_boolean()) {
      if (absl::Status s = CheckSchema(extra, Child(where, "additionalProperties")); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckArrayKeywords(const Schema& schema, std::string_view where) {
  if (schema.contains("items")) {
    const Schema& items = schema.at("items");
    if (items.is_array()) {
      return Refuse(Child(where, "items"), "unsupported JSON-schema items array (tuple)");
    }
    if (absl::Status s = CheckSchema(items, Child(where, "items")); !s.ok()) return s;
  }
  for (const std::string_view key : {"minItems", "maxItems"}) {
    if (absl::Status s = CheckBound(schema, key, where); !s.ok()) return s;
  }
  if (schema.contains("minItems") && schema.contains("maxItems") &&
      schema.at("minItems").get<uint64_t>() > schema.at("maxItems").get<uint64_t>()) {
    return Refuse(where, "minItems is above maxItems");
  }
  return absl::OkStatus();
}

bool IsIntegral(const Schema& v) {
  return v.is_number_integer() ||
         (v.is_number_float() && v.get<double>() == static_cast<double>(v.get<int64_t>()));
}

JsonType TypeOf(const Schema& v) {
  if (v.is_string()) return JsonType::kString;
  if (v.is_number()) return JsonType::kNumber;
  if (v.is_boolean()) return JsonType::kBoolean;
  if (v.is_null()) return JsonType::kNull;
  return v.is_object() ? JsonType::kObject : JsonType::kArray;
}

// The XTML types a schema's `type` (or, without one, its keywords) allows.
struct Types {
  bool has[6] = {};
  bool integer_only = false;
  bool Has(JsonType t) const { return has[static_cast<int>(t)]; }
};

Types TypesOf(const Schema& schema) {
  Types t;
  if (!schema.contains("type")) {
    const bool object = schema.contains("properties") || schema.contains("required") ||
                        schema.contains("additionalProperties");
    const bool array =
        schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems");
    for (const JsonType type : kJsonTypes) {
      t.has[static_cast<int>(type)] = (!object && !array) ||
                                      (object && type == JsonType::kObject) ||
                                      (array && type == JsonType::kArray);
    }
    return t;
  }
  Schema names = schema.at("type");
  if (!names.is_array()) names = Schema::array({names});
  bool integer = false, number = false;
  for (const Schema& n : names) {
    const std::string& name = n.get_ref<const std::string&>();
    integer |= name == "integer";
    number |= name == "number";
    for (const JsonType type : kJsonTypes) {
      if (name == XtmlTypeName(type)) t.has[static_cast<int>(type)] = true;
    }
  }
  if (integer) t.has[static_cast<int>(JsonType::kNumber)] = true;
  t.integer_only = integer && !number;
  return t;
}

}  // namespace

absl::Status CheckSchema(const Schema& schema, std::string_view where) {
  if (schema.is_boolean()) return absl::OkStatus();
  if (!schema.is_object()) return Refuse(where, "a JSON schema must be an object or a boolean");
  const bool any_of = schema.contains("anyOf") || schema.contains("oneOf");
  for (const auto& [key, value] : schema.items()) {
    if (OneOf(key, kAnnotations)) continue;
    if (!OneOf(key, kKeywords)) {
      return Refuse(where, absl::StrCat("unsupported JSON-schema keyword \"", key, "\""));
    }
    if (any_of && key != "anyOf" && key != "oneOf") {
      return Refuse(
          where, absl::StrCat("unsupported JSON-schema keyword \"", key, "\" beside anyOf/oneOf"));
    }
  }
  for (const std::string_view key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key)) continue;
    const Schema& subs = schema.at(key);
    const std::string at = Child(where, key);
    if (!subs.is_array() || subs.empty()) {
      return Refuse(at, std::string(key) + " must be a non-empty array of schemas");
    }
    for (size_t i = 0; i < subs.size(); ++i) {
      if (absl::Status s = CheckSchema(subs[i], Index(at, i)); !s.ok()) return s;
    }
  }
  if (schema.contains("type")) {
    if (absl::Status s = CheckType(schema.at("type"), Child(where, "type")); !s.ok()) return s;
  }
  if (schema.contains("enum") && (!schema.at("enum").is_array() || schema.at("enum").empty())) {
    return Refuse(Child(where, "enum"), "enum must be a non-empty array");
  }
  if (absl::Status s = CheckObjectKeywords(schema, where); !s.ok()) return s;
  return CheckArrayKeywords(schema, where);
}

absl::Status CheckToolParameters(const Schema& schema, std::string_view where) {
  if (!schema.is_object()) {
    return Refuse(where, "tool parameters must be a JSON schema of type object");
  }
  if (absl::Status s = CheckSchema(schema, where); !s.ok()) return s;
  if (schema.empty()) return absl::OkStatus();
  const Types types = TypesOf(schema);
  const bool object_only = std::count(std::begin(types.has), std::end(types.has), true) == 1 &&
                           types.Has(JsonType::kObject);
  if (!object_only || schema.contains("anyOf") || schema.contains("oneOf") ||
      schema.contains("enum") || schema.contains("const")) {
    return Refuse(where, "tool parameters must be a JSON schema of type object");
  }
  return absl::OkStatus();
}

absl::Status CheckResponseSchema(const Schema& schema, std::string_view where) {
  if (!schema.is_object() && !schema.is_boolean()) {
    return Refuse(where, "the response schema must be a JSON schema (an object or a boolean)");
  }
  return CheckSchema(schema, where);
}

std::string_view XtmlTypeName(JsonType type) {
  switch (type) {
    case JsonType::kString:
      return "string";
    case JsonType::kNumber:
      return "number";
    case JsonType::kBoolean:
      return "boolean";
    case JsonType::kNull:
      return "null";
    case JsonType::kObject:
      return "object";
    case JsonType::kArray:
      return "array";
  }
  return "";
}

RuleId OrderedMembers(GrammarBuilder& b, const std::vector<Member>& members, const Seq& separator,
                      std::optional<Element> extra) {
  // rest[i]: the members from i on that are chosen, each after a separator (one came before);
  // first[i]: the same when none came before, so the first chosen one has no separator.
  RuleId rest = extra ? b.Star(GrammarBuilder::Cat({separator, {*extra}})) : b.Rule("none", {{}});
  RuleId first = extra ? b.Optional({*extra, GrammarBuilder::Ref(rest)}) : rest;
  for (size_t i = members.size(); i-- > 0;) {
    const Member& m = members[i];
    Seq after = GrammarBuilder::Cat({separator, m.seq, {GrammarBuilder::Ref(rest)}});
    Seq lead = GrammarBuilder::Cat({m.seq, {GrammarBuilder::Ref(rest)}});
    const RuleId next_rest = m.required ? b.Rule("member", {std::move(after)})
                                        : b.Rule("member?", {std::move(after), {b.Ref(rest)}});
    first = m.required ? b.Rule("first", {std::move(lead)})
                       : b.Rule("first?", {std::move(lead), {b.Ref(first)}});
    rest = next_rest;
  }
  return first;
}

RuleId JsonRules::Cached(RuleId& slot, RuleId (JsonRules::*make)()) {
  if (slot < 0) slot = (this->*make)();
  return slot;
}

RuleId JsonRules::String() { return Cached(string_, &JsonRules::MakeString); }
RuleId JsonRules::Number() { return Cached(number_, &JsonRules::MakeNumber); }
RuleId JsonRules::Integer() { return Cached(integer_, &JsonRules::MakeInteger); }
RuleId JsonRules::AnyValue() { return Cached(any_, &JsonRules::MakeAnyValue); }
RuleId JsonRules::RawText() { return Cached(raw_, &JsonRules::MakeRawText); }
RuleId JsonRules::Space() { return Cached(space_, &JsonRules::MakeSpace); }

RuleId JsonRules::MakeString() {
  SymbolSet plain = SymbolSet::Range(0x20, 0x7f);
  plain.Remove('"');
  plain.Remove('\\');
  SymbolSet hex = SymbolSet::Range('0', '9');
  hex |= SymbolSet::Range('a', 'f');
  hex |= SymbolSet::Range('A', 'F');
  const Element h = b_.Set(hex);
  const RuleId escape =
      b_.Rule("escape", {{b_.Set(SymbolSet::Bytes("\"\\/bfnrt"))}, {b_.Symbol('u'), h, h, h, h}});
  std::vector<Seq> chars = {{b_.Set(plain)}, {b_.Symbol('\\'), b_.Ref(escape)}};
  // Well-formed UTF-8 only (RFC 3629: no overlongs, surrogates or code points past U+10FFFF),
  // byte by byte, since a token may end inside a character.
  const Element tail = b_.Set(SymbolSet::Range(0x80, 0xbf));
  const auto lead = [&](int lo, int hi) { return b_.Set(SymbolSet::Range(lo, hi)); };
  chars.push_back({lead(0xc2, 0xdf), tail});
  chars.push_back({b_.Symbol(0xe0), lead(0xa0, 0xbf), tail});
  chars.push_back({lead(0xe1, 0xec), tail, tail});
  chars.push_back({b_.Symbol(0xed), lead(0x80, 0x9f), tail});
  chars.push_back({lead(0xee, 0xef), tail, tail});
  chars.push_back({b_.Symbol(0xf0), lead(0x90, 0xbf), tail, tail});
  chars.push_back({lead(0xf1, 0xf3), tail, tail, tail});
  chars.push_back({b_.Symbol(0xf4), lead(0x80, 0x8f), tail, tail});
  const RuleId ch = b_.Rule("char", std::move(chars));
  const RuleId body = b_.Star({b_.Ref(ch)});
  return b_.Rule("string", {{b_.Symbol('"'), b_.Ref(body), b_.Symbol('"')}});
}

RuleId JsonRules::MakeInteger() {
  const Element digit = b_.Set(SymbolSet::Range('0', '9'));
  const RuleId digits = b_.Star({digit});
  const RuleId sign = b_.Optional({b_.Symbol('-')});
  return b_.Rule("integer", {{b_.Ref(sign), b_.Symbol('0')},
                             {b_.Ref(sign), b_.Set(SymbolSet::Range('1', '9')), b_.Ref(digits)}});
}

RuleId JsonRules::MakeNumber() {
  const Element digit = b_.Set(SymbolSet::Range('0', '9'));
  const RuleId digits = b_.Plus({digit});
  const RuleId frac = b_.Optional({b_.Symbol('.'), b_.Ref(digits)});
  const RuleId exp_sign = b_.Optional({b_.Set(SymbolSet::Bytes("+-"))});
  const RuleId exp =
      b_.Optional({b_.Set(SymbolSet::Bytes("eE")), b_.Ref(exp_sign), b_.Ref(digits)});
  return b_.Rule("number", {{b_.Ref(Integer()), b_.Ref(frac), b_.Ref(exp)}});
}

RuleId JsonRules::MakeRawText() { return b_.Star({b_.Set(SymbolSet::Range(0, 255))}); }

RuleId JsonRules::MakeSpace() { return b_.Optional(b_.Text(" ")); }

Seq JsonRules::Separator(char c) { return {b_.Symbol(c), b_.Ref(Space())}; }

RuleId JsonRules::MakeAnyValue() {
  const RuleId value = b_.NewRule("value");
  any_ = value;  // the members below refer back to it
  const RuleId member = b_.Rule(
      "member", {GrammarBuilder::Cat({{b_.Ref(String())}, Separator(':'), {b_.Ref(value)}})});
  const RuleId members = OrderedMembers(b_, {}, Separator(','), b_.Ref(member));
  any_object_ = b_.Rule("object", {{b_.Symbol('{'), b_.Ref(members), b_.Symbol('}')}});
  const RuleId items = OrderedMembers(b_, {}, Separator(','), b_.Ref(value));
  any_array_ = b_.Rule("array", {{b_.Symbol('['), b_.Ref(items), b_.Symbol(']')}});
  for (const JsonType type : kJsonTypes) b_.AddAlternative(value, {b_.Ref(AnyOfType(type))});
  return value;
}

RuleId JsonRules::AnyOfType(JsonType type) {
  switch (type) {
    case JsonType::kString:
      return String();
    case JsonType::kNumber:
      return Number();
    case JsonType::kBoolean:
      return b_.Rule("boolean", {b_.Text("true"), b_.Text("false")});
    case JsonType::kNull:
      return b_.Rule("null", {b_.Text("null")});
    case JsonType::kObject:
      AnyValue();
      return any_object_;
    case JsonType::kArray:
      AnyValue();
      return any_array_;
  }
  return -1;
}

RuleId JsonRules::Literal(const Schema& value, bool raw_string) {
  return b_.Rule("literal",
                 {b_.Text(raw_string && value.is_string() ? value.get_ref<const std::string&>()
                                                          : value.dump())});
}

RuleId JsonRules::Object(const Schema& schema) {
  const bool declared = schema.contains("properties");
  std::optional<Element> extra;
  const Schema extra_schema = schema.value("additionalProperties", Schema(!declared));
  if (!extra_schema.is_boolean() || extra_schema.get<bool>()) {
    const RuleId value = Value(extra_schema);
    extra = b_.Ref(b_.Rule(
        "extra", {GrammarBuilder::Cat({{b_.Ref(String())}, Separator(':'), {b_.Ref(value)}})}));
  }
  std::vector<Member> members;
  if (declared) {
    const Schema required = schema.value("required", Schema::array());
    for (const auto& [name, sub] : schema.at("properties").items()) {
      Member& m = members.emplace_back();
      m.seq =
          GrammarBuilder::Cat({b_.Text(Schema(name).dump()), Separator(':'), {b_.Ref(Value(sub))}});
      m.required = std::find(required.begin(), required.end(), Schema(name)) != required.end();
    }
  }
  const RuleId body = OrderedMembers(b_, members, Separator(','), extra);
  return b_.Rule("object", {{b_.Symbol('{'), b_.Ref(body), b_.Symbol('}')}});
}

RuleId JsonRules::Array(const Schema& schema) {
  const int min = schema.value("minItems", 0);
  const int max = schema.value("maxItems", -1);
  if (max == 0) return b_.Rule("array", {b_.Text("[]")});
  const RuleId item = schema.contains("items") ? Value(schema.at("items")) : AnyValue();
  const RuleId more = b_.Repeat(GrammarBuilder::Cat({Separator(','), {b_.Ref(item)}}),
                                std::max(min - 1, 0), max < 0 ? -1 : max - 1);
  const Seq items = {b_.Ref(item), b_.Ref(more)};
  const RuleId body = min == 0 ? b_.Optional(items) : b_.Wrap(items);
  return b_.Rule("array", {{b_.Symbol('['), b_.Ref(body), b_.Symbol(']')}});
}

std::optional<RuleId> JsonRules::ValueOfType(const Schema& schema, JsonType type, bool raw_string) {
  if (schema.is_boolean() || schema.empty()) {
    if (schema.is_boolean() && !schema.get<bool>()) return std::nullopt;
    return raw_string && type == JsonType::kString ? RawText() : AnyOfType(type);
  }
  std::vector<Seq> alternatives;
  for (const std::string_view key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key)) continue;
    for (const Schema& sub : schema.at(key)) {
      if (auto rule = ValueOfType(sub, type, raw_string)) alternatives.push_back({b_.Ref(*rule)});
    }
    if (alternatives.empty()) return std::nullopt;
    return b_.Rule(std::string(key), std::move(alternatives));
  }
  const Types types = TypesOf(schema);
  if (!types.Has(type)) return std::nullopt;
  if (schema.contains("const") || schema.contains("enum")) {
    const Schema values =
        schema.contains("const") ? Schema::array({schema.at("const")}) : schema.at("enum");
    for (const Schema& v : values) {
      if (TypeOf(v) != type || (types.integer_only && !IsIntegral(v))) continue;
      alternatives.push_back({b_.Ref(Literal(v, raw_string))});
    }
    if (alternatives.empty()) return std::nullopt;
    return b_.Rule("enum", std::move(alternatives));
  }
  switch (type) {
    case JsonType::kString:
      return raw_string ? RawText() : String();
    case JsonType::kNumber:
      return types.integer_only ? Integer() : Number();
    case JsonType::kObject:
      return Object(schema);
    case JsonType::kArray:
      return Array(schema);
    default:
      return AnyOfType(type);
  }
}

RuleId JsonRules::Value(const Schema& schema) {
  std::vector<Seq> alternatives;
  for (const JsonType type : kJsonTypes) {
    if (auto rule = ValueOfType(schema, type, false)) alternatives.push_back({b_.Ref(*rule)});
  }
  return b_.Rule("json", std::move(alternatives));
}

}  // namespace k3::grammar
