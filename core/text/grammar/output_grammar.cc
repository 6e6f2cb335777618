#include "core/text/grammar/output_grammar.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/text/grammar/json_schema.h"

namespace k3::grammar {
namespace {

using Seq = GrammarBuilder::Seq;

class TurnBuilder {
 public:
  explicit TurnBuilder(const OutputSpec& spec) : spec_(spec), json_(b_) {}

  Grammar Build() && {
    const bool tools = !spec_.tools.empty() && spec_.tool_choice != ToolChoice::kNone;
    const bool forced =
        spec_.tool_choice == ToolChoice::kRequired || spec_.tool_choice == ToolChoice::kNamed;
    const bool json = spec_.response_format != ResponseFormat::kText;
    const Seq close_response = Tag(kClose, "response");
    // The response body (after its open tag, which the prompt wrote with thinking off), its
    // close and the tools block.
    std::vector<Seq> response;
    Seq after;
    if (tools) {
      const RuleId block = ToolsBlock();
      after = {b_.Ref(forced ? block : b_.Optional({b_.Ref(block)}))};
      if (json) response.push_back(Cat({close_response, {b_.Ref(block)}}));
    }
    response.push_back(Cat({{b_.Ref(Body())}, close_response, after}));
    const RuleId rest = b_.Rule("response", std::move(response));
    Seq turn;
    if (spec_.thinking) {
      turn = Cat({{b_.Ref(json_.RawText())}, Tag(kClose, "think"), Tag(kOpen, "response")});
    }
    turn = Cat({turn, {b_.Ref(rest)}, Tag(kClose, "message"), {b_.Symbol(kEndOfMsg)}});
    const RuleId start = b_.Rule("turn", {std::move(turn)});
    return std::move(b_).Build(start);
  }

 private:
  static Seq Cat(std::initializer_list<Seq> parts) { return GrammarBuilder::Cat(parts); }

  // `<|open|>tag<|sep|>` or `<|close|>tag<|sep|>`.
  Seq Tag(int marker, std::string_view tag) {
    return Cat({{b_.Symbol(marker)}, b_.Text(tag), {b_.Symbol(kSep)}});
  }

  RuleId Body() {
    switch (spec_.response_format) {
      case ResponseFormat::kText:
        return json_.RawText();
      case ResponseFormat::kJsonObject:
        return Padded(json_.AnyOfType(JsonType::kObject));
      case ResponseFormat::kJsonSchema:
        return Padded(json_.Value(spec_.response_schema));
    }
    return json_.RawText();
  }

  // `value` with an optional space on either side.
  RuleId Padded(RuleId value) {
    return b_.Rule("padded", {{b_.Ref(json_.Space()), b_.Ref(value), b_.Ref(json_.Space())}});
  }

  RuleId ToolsBlock() {
    std::vector<Seq> calls;
    for (const ToolSpec& tool : spec_.tools) {
      if (spec_.tool_choice == ToolChoice::kNamed && tool.name != spec_.named_tool) continue;
      calls.push_back({b_.Ref(Call(tool))});
    }
    const RuleId call = b_.Rule("call", std::move(calls));
    const bool one = spec_.tool_choice == ToolChoice::kNamed || !spec_.parallel_tool_calls;
    const RuleId all = one ? call : b_.Plus({b_.Ref(call)});
    return b_.Rule("tools", {Cat({Tag(kOpen, "tools"), {b_.Ref(all)}, Tag(kClose, "tools")})});
  }

  RuleId Call(const ToolSpec& tool) {
    if (digits_ < 0) digits_ = b_.Plus({b_.Set(SymbolSet::Range('0', '9'))});
    Seq header =
        Cat({{b_.Symbol(kOpen)},
             b_.Text(absl::StrCat("call tool=\"", EscapeAttribute(tool.name), "\" index=\"")),
             {b_.Ref(digits_)},
             b_.Text("\""),
             {b_.Symbol(kSep)}});
    return b_.Rule("call " + tool.name,
                   {Cat({header, {b_.Ref(Arguments(tool))}, Tag(kClose, "call")})});
  }

  RuleId Arguments(const ToolSpec& tool) {
    const Schema& params = tool.parameters;
    if (!tool.strict) return b_.Star({b_.Ref(Argument(Identifier(), Schema(true)))});
    const bool declared = params.contains("properties");
    const Schema extra = params.value("additionalProperties", Schema(!declared));
    std::optional<Element> more;
    if (!extra.is_boolean() || extra.get<bool>()) more = b_.Ref(Argument(AttributeText(), extra));
    std::vector<Member> members;
    if (declared) {
      const Schema required = params.value("required", Schema::array());
      for (const auto& [name, schema] : params.at("properties").items()) {
        const RuleId key = b_.Rule("key", {b_.Text(EscapeAttribute(name))});
        members.push_back(
            {{b_.Ref(Argument(key, schema))},
             std::find(required.begin(), required.end(), Schema(name)) != required.end()});
      }
    }
    return OrderedMembers(b_, members, {}, more);
  }

  // `<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>`, for each XTML type
  // the schema allows.
  RuleId Argument(RuleId key, const Schema& schema) {
    std::vector<Seq> typed;
    for (const JsonType type : kJsonTypes) {
      const std::optional<RuleId> value = json_.ValueOfType(schema, type, /*raw_string=*/true);
      if (!value) continue;
      const RuleId body = type == JsonType::kString ? *value : Padded(*value);
      typed.push_back(
          Cat({b_.Text(std::string(XtmlTypeName(type)) + "\""), {b_.Symbol(kSep), b_.Ref(body)}}));
    }
    const RuleId value = b_.Rule("typed value", std::move(typed));
    return b_.Rule("argument", {Cat({{b_.Symbol(kOpen)},
                                     b_.Text("argument key=\""),
                                     {b_.Ref(key)},
                                     b_.Text("\" type=\""),
                                     {b_.Ref(value)},
                                     Tag(kClose, "argument")})});
  }

  // `[A-Za-z_][A-Za-z0-9_]*`: a key of a tool without a strict schema.
  RuleId Identifier() {
    SymbolSet head = SymbolSet::Range('A', 'Z');
    head |= SymbolSet::Range('a', 'z');
    head.Add('_');
    SymbolSet tail = head;
    tail |= SymbolSet::Range('0', '9');
    return b_.Rule("identifier", {{b_.Set(head), b_.Ref(b_.Star({b_.Set(tail)}))}});
  }

  // An escaped attribute value, not empty: no `"`, and `&` only in `&amp;` or `&quot;`.
  RuleId AttributeText() {
    SymbolSet plain = SymbolSet::Range(0, 255);
    plain.Remove('"');
    plain.Remove('&');
    const RuleId ch =
        b_.Rule("attribute char", {{b_.Set(plain)}, b_.Text("&amp;"), b_.Text("&quot;")});
    return b_.Plus({b_.Ref(ch)});
  }

  const OutputSpec& spec_;
  GrammarBuilder b_;
  JsonRules json_;
  RuleId digits_ = -1;
};

}  // namespace

std::string EscapeAttribute(std::string_view value) {
  std::string out;
  for (const char c : value) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out += c;
    }
  }
  return out;
}

absl::Status CheckOutputSpec(const OutputSpec& spec) {
  for (size_t i = 0; i < spec.tools.size(); ++i) {
    const ToolSpec& tool = spec.tools[i];
    if (!tool.strict) continue;
    const std::string where = absl::StrCat("tools[", i, "].function.parameters");
    if (absl::Status s = CheckToolParameters(tool.parameters, where); !s.ok()) return s;
  }
  if (spec.response_format == ResponseFormat::kJsonSchema) {
    if (absl::Status s =
            CheckResponseSchema(spec.response_schema, "response_format.json_schema.schema");
        !s.ok()) {
      return s;
    }
  }
  const bool forced =
      spec.tool_choice == ToolChoice::kRequired || spec.tool_choice == ToolChoice::kNamed;
  if (forced && spec.tools.empty()) {
    return absl::InvalidArgumentError("tool_choice asks for a tool call but no tools are declared");
  }
  if (spec.tool_choice == ToolChoice::kNamed) {
    for (const ToolSpec& tool : spec.tools) {
      if (tool.name == spec.named_tool) return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("tool_choice names \"", spec.named_tool, "\", which is not declared"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Grammar> BuildOutputGrammar(const OutputSpec& spec) {
  if (absl::Status s = CheckOutputSpec(spec); !s.ok()) return s;
  return TurnBuilder(spec).Build();
}

}  // namespace k3::grammar
