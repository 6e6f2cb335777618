// JSON schemas as grammar rules (grammar.h), for tool arguments and JSON responses (TOOLS.md
// section 9, the schema rules).
//
// Supported keywords: `type` (string, number, integer, boolean, null, object, array, or a list),
// `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`, `minItems`,
// `maxItems`, `anyOf` and `oneOf` (alone, beside annotations only), and the annotations
// `description`, `title`, `default`, `examples`, `$schema`, `strict`. Check* refuses anything
// else, naming the keyword and where it is.
//
// What the grammar generates:
//  * Objects: the declared properties in the schema's key order, every required one, any
//    optional one; `additionalProperties` false or absent allows no other key. True, or a
//    schema, allows further keys (any JSON string, a declared name included) after the declared
//    ones, their values any JSON or per that schema.
//  * No type keyword: `properties`/`required`/`additionalProperties` mean an object, `items`/
//    `minItems`/`maxItems` an array, and otherwise any JSON value.
//  * Compact JSON: at most one space after `:` and `,`, none elsewhere.
//  * Strings: JSON strings, escapes included, no raw control characters, well-formed UTF-8
//    (matched byte by byte: a token may end inside a character). Numbers: JSON numbers; integers
//    without fraction or exponent. `enum`/`const`: the values as nlohmann's dump writes them.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/text/grammar/grammar.h"
#include "nlohmann/json.hpp"

namespace k3::grammar {

using Schema = nlohmann::ordered_json;

// Refuses (InvalidArgument) what the grammar cannot enforce, e.g.
// `unsupported JSON-schema keyword "pattern" at tools[0].function.parameters.properties.city`;
// `where` is the schema's own location.
absl::Status CheckSchema(const Schema& schema, std::string_view where);
// As CheckSchema, and the top level must be an object schema (`{}` is one with no properties).
absl::Status CheckToolParameters(const Schema& schema, std::string_view where);
// As CheckSchema, and the top level must be a JSON object or a boolean.
absl::Status CheckResponseSchema(const Schema& schema, std::string_view where);

// The JSON types as XTML's `type` attribute names them (TOOLS.md section 5): integers are
// numbers.
enum class JsonType { kString, kNumber, kBoolean, kNull, kObject, kArray };
inline constexpr JsonType kJsonTypes[] = {JsonType::kString, JsonType::kNumber, JsonType::kBoolean,
                                          JsonType::kNull,   JsonType::kObject, JsonType::kArray};
std::string_view XtmlTypeName(JsonType type);

// Members in a fixed order, each optional or not, with `separator` between two (nothing
// before the first); `extra`, if given, may repeat after them. Builds objects' members and
// XTML call arguments.
struct Member {
  GrammarBuilder::Seq seq;
  bool required = false;
};
RuleId OrderedMembers(GrammarBuilder& b, const std::vector<Member>& members,
                      const GrammarBuilder::Seq& separator, std::optional<Element> extra);

// Builds the rules of checked schemas on one builder, sharing the common ones.
class JsonRules {
 public:
  explicit JsonRules(GrammarBuilder& b) : b_(b) {}

  // A JSON value valid per `schema`.
  RuleId Value(const Schema& schema);
  // The values of `schema` whose XTML type is `type`, or nullopt if there are none. With
  // `raw_string`, strings are the raw text (TOOLS.md section 5: no quotes, no escapes).
  std::optional<RuleId> ValueOfType(const Schema& schema, JsonType type, bool raw_string);
  // Any JSON value; any JSON value of one type.
  RuleId AnyValue();
  RuleId AnyOfType(JsonType type);
  // Any ordinary bytes (a raw string).
  RuleId RawText();
  // An optional single space.
  RuleId Space();

 private:
  RuleId String();
  RuleId Number();
  RuleId Integer();
  RuleId Literal(const Schema& value, bool raw_string);
  RuleId Object(const Schema& schema);
  RuleId Array(const Schema& schema);
  GrammarBuilder::Seq Separator(char c);
  RuleId Cached(RuleId& slot, RuleId (JsonRules::*make)());
  RuleId MakeString();
  RuleId MakeNumber();
  RuleId MakeInteger();
  RuleId MakeAnyValue();
  RuleId MakeRawText();
  RuleId MakeSpace();

  GrammarBuilder& b_;
  RuleId string_ = -1, number_ = -1, integer_ = -1, any_ = -1, raw_ = -1, space_ = -1;
  RuleId any_object_ = -1, any_array_ = -1;
};

}  // namespace k3::grammar
