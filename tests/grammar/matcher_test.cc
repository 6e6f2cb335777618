// The pushdown matcher (core/text/grammar/matcher.h) and the JSON-schema rules (json_schema.h): what
// grammars accept and refuse, repetition bounds, empty loops, bounded stacks, Compact; the
// schema checks' messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/text/grammar/json_schema.h"
#include "tests/grammar/grammar_test_util.h"

namespace k3::grammar {
namespace {

using ::k3::grammar::testing::Accepts;
using ::testing::HasSubstr;

// A grammar whose start rule is `make(builder)`.
template <typename F>
Grammar Make(F make) {
  GrammarBuilder b;
  const RuleId start = make(b);
  return std::move(b).Build(start);
}

TEST(MatcherTest, LiteralsSetsAndSpecials) {
  const Grammar g = Make([](GrammarBuilder& b) {
    const RuleId digits = b.Plus({b.Set(SymbolSet::Range('0', '9'))});
    return b.Rule("n", {GrammarBuilder::Cat({b.Text("n="), {b.Ref(digits), b.Symbol(kSep)}})});
  });
  EXPECT_TRUE(Accepts(g, "n=42<|sep|>"));
  EXPECT_TRUE(Accepts(g, "n=0<|sep|>"));
  EXPECT_FALSE(Accepts(g, "n=<|sep|>"));
  EXPECT_FALSE(Accepts(g, "n=42"));          // incomplete
  EXPECT_FALSE(Accepts(g, "n=4x<|sep|>"));   // a byte outside the set
  EXPECT_FALSE(Accepts(g, "n=42<|open|>"));  // the wrong special
  EXPECT_FALSE(Accepts(g, "n=42<|sep|>!"));  // past the end
}

TEST(MatcherTest, RepeatHonoursItsBounds) {
  const Grammar g = Make([](GrammarBuilder& b) { return b.Repeat(b.Text("ab"), 2, 4); });
  EXPECT_FALSE(Accepts(g, "ab"));
  EXPECT_TRUE(Accepts(g, "abab"));
  EXPECT_TRUE(Accepts(g, "ababab"));
  EXPECT_TRUE(Accepts(g, "abababab"));
  EXPECT_FALSE(Accepts(g, "ababababab"));
  EXPECT_FALSE(Accepts(g, "aba"));
  const Grammar open = Make([](GrammarBuilder& b) { return b.Repeat(b.Text("x"), 1, -1); });
  EXPECT_FALSE(Accepts(open, ""));
  EXPECT_TRUE(Accepts(open, std::string(500, 'x')));
}

TEST(MatcherTest, RepetitionKeepsOneStateAndEmptyLoopsEnd) {
  // (a?)* loops on the empty string; the matcher must not recurse forever, and a long run of
  // repetitions must come back to the same State (constant stack depth).
  Grammar g = Make([](GrammarBuilder& b) {
    const RuleId maybe = b.Optional(b.Text("a"));
    const RuleId star = b.Star({b.Ref(maybe)});
    return b.Rule("s", {GrammarBuilder::Cat({{b.Ref(star)}, b.Text("b")})});
  });
  EXPECT_TRUE(Accepts(g, "b"));
  EXPECT_TRUE(Accepts(g, "aaab"));
  Matcher m(std::make_shared<Grammar>(std::move(g)));
  const Matcher::State once = m.Next(m.start(), 'a');
  Matcher::State s = once;
  for (int i = 0; i < 1000; ++i) s = m.Next(s, 'a');
  EXPECT_EQ(s, once);
  EXPECT_LT(m.num_states(), 5);
  EXPECT_FALSE(m.overflowed());
}

TEST(MatcherTest, AmbiguityDedupesStacksAndCompactKeepsTheState) {
  // ("a" | "a" | "aa")* "b": many paths reach the same stacks; the State stays small.
  Grammar g = Make([](GrammarBuilder& b) {
    const RuleId alt = b.Rule("alt", {b.Text("a"), b.Text("a"), b.Text("aa")});
    const RuleId star = b.Star({b.Ref(alt)});
    return b.Rule("s", {GrammarBuilder::Cat({{b.Ref(star)}, b.Text("b")})});
  });
  Matcher m(std::make_shared<Grammar>(std::move(g)));
  Matcher::State s = m.start();
  for (int i = 0; i < 64; ++i) s = m.Next(s, 'a');
  ASSERT_NE(s, Matcher::kDead);
  EXPECT_LT(m.num_states(), 8);
  const Matcher::State kept = m.Compact(s);
  EXPECT_EQ(m.num_states(), 1);
  EXPECT_FALSE(m.Accepting(kept));
  EXPECT_TRUE(m.Accepting(m.NextBytes(kept, "aab")));
  EXPECT_EQ(m.NextBytes(kept, "ac"), Matcher::kDead);
}

// The shortest completion of each State, exact through alternatives, bounded repetition,
// recursion (nested brackets) and Compact; and a shortest way exists symbol by symbol.
TEST(MatcherTest, MinCompletionIsTheShortestWayToAccept) {
  const Grammar g = Make([](GrammarBuilder& b) {
    const RuleId value = b.NewRule("value");
    const RuleId items = b.Star({b.Ref(value)});
    b.AddAlternative(value, b.Text("x"));
    b.AddAlternative(value, b.Text("long"));
    b.AddAlternative(value, GrammarBuilder::Cat({b.Text("["), {b.Ref(items)}, b.Text("]")}));
    const RuleId digits = b.Repeat({b.Set(SymbolSet::Range('0', '9'))}, 2, 3);
    return b.Rule("s", {GrammarBuilder::Cat(
                           {{b.Ref(value)}, b.Text("="), {b.Ref(digits)}, {b.Symbol(kEndOfMsg)}})});
  });
  Matcher m(std::make_shared<Grammar>(g));
  const auto at = [&](std::string_view text) {
    Matcher::State s = m.start();
    for (const int symbol : ::k3::grammar::testing::Symbols(text)) s = m.Next(s, symbol);
    return s;
  };
  EXPECT_EQ(m.MinCompletion(m.start()), 5);  // x=00 and the end
  EXPECT_EQ(m.MinCompletion(at("l")), 7);
  EXPECT_EQ(m.MinCompletion(at("[[[")), 7);
  EXPECT_EQ(m.MinCompletion(at("[[[x")), 7);
  EXPECT_EQ(m.MinCompletion(at("[x]=")), 3);
  EXPECT_EQ(m.MinCompletion(at("[x]=1")), 2);
  EXPECT_EQ(m.MinCompletion(at("[x]=12")), 1);
  EXPECT_EQ(m.MinCompletion(at("[x]=123")), 1);
  EXPECT_EQ(m.MinCompletion(at("[x]=12<|end_of_msg|>")), 0);
  // Following a shortest way, each symbol takes one off.
  Matcher::State s = at("[[lo");
  for (int left = m.MinCompletion(s); left > 0; --left) {
    int best = -1;
    for (int symbol = 0; symbol < kNumSymbols && best < 0; ++symbol) {
      const Matcher::State next = m.Next(s, symbol);
      if (next != Matcher::kDead && m.MinCompletion(next) == left - 1) best = symbol;
    }
    ASSERT_GE(best, 0) << left;
    s = m.Next(s, best);
  }
  EXPECT_TRUE(m.Accepting(s));
  const Matcher::State deep = at("[[[[l");
  const int before = m.MinCompletion(deep);
  EXPECT_EQ(m.MinCompletion(m.Compact(deep)), before);
}

TEST(MatcherTest, DeepRecursionIsBounded) {
  // x ::= "(" x ")" | "": nesting deeper than kMaxDepth is dropped, not grown without end.
  Grammar g = Make([](GrammarBuilder& b) {
    const RuleId x = b.NewRule("x");
    b.AddAlternative(x, GrammarBuilder::Cat({b.Text("("), {b.Ref(x)}, b.Text(")")}));
    b.AddAlternative(x, {});
    return x;
  });
  EXPECT_TRUE(Accepts(g, "((()))"));
  EXPECT_FALSE(Accepts(g, "(()"));
  Matcher m(std::make_shared<Grammar>(std::move(g)));
  Matcher::State s = m.start();
  for (int i = 0; i < Matcher::kMaxDepth + 10 && s != Matcher::kDead; ++i) s = m.Next(s, '(');
  EXPECT_TRUE(m.overflowed());
}

// A JSON value grammar of `schema` (checked first).
Grammar JsonGrammar(const char* schema_text) {
  const Schema schema = Schema::parse(schema_text);
  EXPECT_TRUE(CheckResponseSchema(schema, "schema").ok()) << schema_text;
  return Make([&](GrammarBuilder& b) { return JsonRules(b).Value(schema); });
}

TEST(JsonSchemaTest, ScalarsAndStrings) {
  const Grammar number = JsonGrammar(R"({"type":"number"})");
  for (const char* ok : {"0", "-1", "3.25", "1e5", "-0.5E-3", "10"}) {
    EXPECT_TRUE(Accepts(number, ok)) << ok;
  }
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "\"1\"", "- 1"}) {
    EXPECT_FALSE(Accepts(number, bad)) << bad;
  }
  const Grammar integer = JsonGrammar(R"({"type":"integer"})");
  EXPECT_TRUE(Accepts(integer, "-42"));
  EXPECT_FALSE(Accepts(integer, "4.0"));
  EXPECT_FALSE(Accepts(integer, "4e1"));
  const Grammar str = JsonGrammar(R"({"type":"string"})");
  EXPECT_TRUE(Accepts(str, R"("a \"q\" \\ \u00e9 \n caf\u00E9 é")"));
  EXPECT_FALSE(Accepts(str, "\"a\nb\""));                         // a raw control character
  EXPECT_TRUE(Accepts(str, "\"\xf0\x9f\x98\x80\xe2\x82\xac\""));  // U+1F600, U+20AC
  for (const char* bad : {"\"\xc3\x28\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xe2\x82\""}) {
    EXPECT_FALSE(Accepts(str, bad)) << bad;  // broken, overlong, a surrogate, cut short
  }
  EXPECT_FALSE(Accepts(str, R"("\x")"));
  EXPECT_FALSE(Accepts(str, R"("\u12")"));
  const Grammar nullable = JsonGrammar(R"({"type":["boolean","null"]})");
  EXPECT_TRUE(Accepts(nullable, "true"));
  EXPECT_TRUE(Accepts(nullable, "null"));
  EXPECT_FALSE(Accepts(nullable, "0"));
  const Grammar any = JsonGrammar(R"({"description":"anything"})");
  EXPECT_TRUE(Accepts(any, R"({"a": [1, {"b":null}], "c":"d"})"));
  EXPECT_FALSE(Accepts(any, R"({"a":1,})"));
}

TEST(JsonSchemaTest, ObjectsKeepDeclaredOrderAndRequiredKeys) {
  const Grammar g = JsonGrammar(R"({"type":"object","properties":{
      "a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"]})");
  EXPECT_TRUE(Accepts(g, R"({"b":"x"})"));
  EXPECT_TRUE(Accepts(g, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(Accepts(g, R"({"a": 1, "b": "x"})"));
  EXPECT_TRUE(Accepts(g, R"({"b":"x", "c":false})"));
  EXPECT_FALSE(Accepts(g, R"({})"));                 // b is required
  EXPECT_FALSE(Accepts(g, R"({"b":"x","a":1})"));    // out of order
  EXPECT_FALSE(Accepts(g, R"({"b":"x","d":1})"));    // undeclared
  EXPECT_FALSE(Accepts(g, R"({"a":"1","b":"x"})"));  // wrong type
  EXPECT_FALSE(Accepts(g, R"({"b":"x",})"));
  EXPECT_FALSE(Accepts(g, R"({"b":"x",  "c":true})"));  // two spaces
  const Grammar optional = JsonGrammar(R"({"properties":{"a":{},"b":{}}})");
  for (const char* ok : {"{}", R"({"a":1})", R"({"b":2})", R"({"a":1,"b":2})"}) {
    EXPECT_TRUE(Accepts(optional, ok)) << ok;
  }
  const Grammar extra = JsonGrammar(
      R"({"properties":{"a":{"type":"null"}},"additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(Accepts(extra, R"({"a":null,"x":1,"y":2})"));
  EXPECT_TRUE(Accepts(extra, R"({"x":1})"));
  EXPECT_FALSE(Accepts(extra, R"({"x":"1"})"));
}

TEST(JsonSchemaTest, ArraysEnumsConstAnyOf) {
  const Grammar arr = JsonGrammar(R"({"type":"array","items":{"type":"integer"},
                                      "minItems":1,"maxItems":3})");
  EXPECT_FALSE(Accepts(arr, "[]"));
  EXPECT_TRUE(Accepts(arr, "[1]"));
  EXPECT_TRUE(Accepts(arr, "[1, 2,3]"));
  EXPECT_FALSE(Accepts(arr, "[1,2,3,4]"));
  EXPECT_FALSE(Accepts(arr, "[1.5]"));
  const Grammar e = JsonGrammar(R"({"enum":["red","green",3,null]})");
  for (const char* ok : {R"("red")", R"("green")", "3", "null"}) EXPECT_TRUE(Accepts(e, ok)) << ok;
  EXPECT_FALSE(Accepts(e, R"("blue")"));
  EXPECT_FALSE(Accepts(e, "4"));
  const Grammar typed_enum = JsonGrammar(R"({"type":"string","enum":["a",1]})");
  EXPECT_TRUE(Accepts(typed_enum, R"("a")"));
  EXPECT_FALSE(Accepts(typed_enum, "1"));
  const Grammar c = JsonGrammar(R"({"const":{"k":[1,"x"]}})");
  EXPECT_TRUE(Accepts(c, R"({"k":[1,"x"]})"));
  EXPECT_FALSE(Accepts(c, R"({"k":[1]})"));
  const Grammar any_of = JsonGrammar(R"({"anyOf":[{"type":"string"},{"type":"integer"}]})");
  EXPECT_TRUE(Accepts(any_of, R"("s")"));
  EXPECT_TRUE(Accepts(any_of, "7"));
  EXPECT_FALSE(Accepts(any_of, "7.5"));
}

TEST(SchemaCheckTest, RefusesUnsupportedKeywordsNamingThemAndWhere) {
  const std::string where = "tools[0].function.parameters";
  struct Case {
    const char* schema;
    const char* keyword;
    const char* at;
  };
  const Case cases[] = {
      {R"({"type":"object","properties":{"city":{"type":"string","pattern":"^a"}}})", "pattern",
       ".properties.city"},
      {R"({"type":"object","properties":{"d":{"type":"string","format":"date"}}})", "format",
       ".properties.d"},
      {R"({"type":"object","properties":{"r":{"$ref":"#/x"}}})", "$ref", ".properties.r"},
      {R"({"type":"object","properties":{"s":{"type":"string","minLength":1}}})", "minLength",
       ".properties.s"},
      {R"({"type":"object","properties":{"n":{"type":"number","minimum":0}}})", "minimum",
       ".properties.n"},
      {R"({"type":"object","if":{}})", "if", ""},
      {R"({"type":"object","properties":{"x":{"not":{}}}})", "not", ".properties.x"},
      {R"({"type":"object","patternProperties":{}})", "patternProperties", ""},
      {R"({"type":"object","properties":{"l":{"type":"array","items":{"uniqueItems":true}}}})",
       "uniqueItems", ".properties.l.items"},
      {R"({"type":"object","properties":{"u":{"anyOf":[{},{"maxLength":3}]}}})", "maxLength",
       ".properties.u.anyOf[1]"},
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckToolParameters(Schema::parse(c.schema), where);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.schema;
    EXPECT_EQ(s.message(), std::string("unsupported JSON-schema keyword \"") + c.keyword +
                               "\" at " + where + c.at);
  }
}

TEST(SchemaCheckTest, ToolParametersMustBeAnObjectSchema) {
  for (const char* bad : {R"({"type":"string"})", R"([1])", R"(true)", R"({"type":["object",
       "null"]})",
                          R"({"anyOf":[{"type":"object"}]})", R"({"items":{}})"}) {
    const absl::Status s = CheckToolParameters(Schema::parse(bad), "tools[2].function.parameters");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("tool parameters must be a JSON schema of type object"));
    EXPECT_THAT(s.message(), HasSubstr("at tools[2].function.parameters"));
  }
  for (const char* ok : {R"({})", R"({"type":"object"})", R"({"properties":{}})",
                         R"({"type":"object","properties":{"a":{}},"required":["a"],
                             "additionalProperties":false,"strict":true,"title":"t"})"}) {
    EXPECT_TRUE(CheckToolParameters(Schema::parse(ok), "p").ok()) << ok;
  }
  EXPECT_FALSE(CheckResponseSchema(Schema::parse("3"), "response_format").ok());
  EXPECT_TRUE(CheckResponseSchema(Schema::parse(R"({"type":"array"})"), "r").ok());
  // Malformed values of supported keywords are refused too, with their location.
  EXPECT_THAT(
      CheckSchema(Schema::parse(R"({"properties":{"a":{}},"required":["b"]})"), "s").message(),
      HasSubstr("at s.required"));
  EXPECT_THAT(CheckSchema(Schema::parse(R"({"type":"date"})"), "s").message(),
              HasSubstr("at s.type"));
  EXPECT_THAT(CheckSchema(Schema::parse(R"({"maxItems":-1})"), "s").message(),
              HasSubstr("at s.maxItems"));
}

}  // namespace
}  // namespace k3::grammar
