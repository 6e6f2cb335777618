// GrammarConstraint::Mask on the demo vocabulary (4,096 ids), in the states a tool-calling turn
// goes through: free text (the think body), inside a JSON string of an object argument (the
// most expensive: nearly every token survives, so the trie walk goes deep), at the start of a
// JSON value in an array, inside a number. `cold` walks the trie on every Mask (no mask cache;
// the matcher's transitions known); `warm` is the repeated State, as inside a long string;
// `first` is a fresh constraint's first Mask there (nothing known yet). Each cold or warm
// iteration copies fresh logits (16 KB) and masks them. `near_budget` is a Mask with a token
// budget left at exactly the State's shortest completion (set_token_budget), where every
// allowed token is judged by the completion after it: the mask cache is on, so the figure is
// the budget's own walk. BM_DemoDecodeStep, for scale, is one decode step of the demo model
// (eight layers, synthesized on first use and removed at exit).
//
//   k3_bench_grammar [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "core/text/grammar/token_mask.h"
#include "core/synth/synth.h"
#include "core/text/tokenizer/tokenizer.h"
#include "pipeline/engine.h"

namespace k3::grammar {
namespace {

struct Demo {
  std::string dir;
  std::unique_ptr<Tokenizer> tok;
  std::shared_ptr<const TokenTrie> trie;
};

void Die(const absl::Status& status) {
  std::cerr << status << "\n";
  std::exit(1);
}

const Demo& GetDemo() {
  static Demo* demo = [] {
    auto* d = new Demo();
    std::string templ = (std::filesystem::temp_directory_path() / "k3-bench-XXXXXX").string();
    d->dir = ::mkdtemp(templ.data());
    SynthOptions opt;
    opt.preset = "demo";
    opt.out_dir = d->dir;
    opt.overrides = {{"num_hidden_layers", "1"}, {"full_attn_layers", "1"}};
    if (auto r = Synthesize(opt); !r.ok()) Die(r.status());
    auto tok = Tokenizer::Load(d->dir);
    if (!tok.ok()) Die(tok.status());
    d->tok = std::make_unique<Tokenizer>(*std::move(tok));
    auto trie = TokenTrie::Build(*d->tok);
    if (!trie.ok()) Die(trie.status());
    d->trie = *std::move(trie);
    std::filesystem::remove_all(d->dir);
    return d;
  }();
  return *demo;
}

// A spec with one tool whose `task` argument is a nested object.
OutputSpec Spec() {
  OutputSpec spec;
  spec.tools = {{"plan", nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "task":{"type":"object","properties":{"title":{"type":"string"},
        "steps":{"type":"array","items":{"type":"object","properties":{
          "n":{"type":"integer"},"note":{"type":"string"},"done":{"type":"boolean"}},
          "required":["n"]}},"priority":{"enum":["low","high"]}},
        "required":["title","steps"]}},"required":["task"]})"),
                 true}};
  spec.tool_choice = ToolChoice::kRequired;
  return spec;
}

constexpr const char* kMarkers[] = {"<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"};

// Feeds `text` (markers as specials) to the constraint.
void Feed(GrammarConstraint& c, const Demo& demo, std::string text) {
  while (!text.empty()) {
    size_t at = std::string::npos;
    int which = -1;
    for (int m = 0; m < 4; ++m) {
      const size_t p = text.find(kMarkers[m]);
      if (p < at) at = p, which = m;
    }
    for (const TokenId id : demo.tok->Encode(text.substr(0, at), false)) c.Accept(id);
    if (which < 0) break;
    c.Accept(demo.trie->special_id(kEndOfMsg + which));
    text.erase(0, at + std::string(kMarkers[which]).size());
  }
}

const std::string kCall =
    "Planning.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
    "<|open|>tools<|sep|><|open|>call tool=\"plan\" index=\"1\"<|sep|><|open|>argument "
    "key=\"task\" type=\"object\"<|sep|>";

// `budget`: leave exactly the shortest completion of the State after `prefix`.
void BM_Mask(benchmark::State& state, const std::string& prefix, bool cache, bool budget) {
  const Demo& demo = GetDemo();
  auto c = GrammarConstraint::ForOutput(Spec(), demo.trie);
  if (!c.ok()) Die(c.status());
  (*c)->set_cache_masks(cache);
  Feed(**c, demo, prefix);
  if ((*c)->failed()) Die(absl::InternalError("the prefix does not fit the grammar"));
  if (budget) {
    constexpr int kLarge = 1 << 30;
    (*c)->set_token_budget(kLarge);
    const int accepted = kLarge - (*c)->remaining_tokens();
    (*c)->set_token_budget(accepted + (*c)->min_completion());
    state.counters["remaining"] = (*c)->remaining_tokens();
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> base(demo.tok->vocab_size());
  for (float& x : base) x = normal(rng);
  std::vector<float> logits = base;
  for (auto _ : state) {
    std::copy(base.begin(), base.end(), logits.begin());
    (*c)->Mask(logits);
    benchmark::DoNotOptimize(logits.data());
  }
  int allowed = 0;
  for (const float x : logits) allowed += x > -1e30f;
  state.counters["allowed"] = allowed;
  state.counters["free_text"] = (*c)->free_text();
}

// The first Mask in a fresh constraint's State: the matcher's transitions are computed as the
// walk goes (the constraint is built and fed with the timer paused).
void BM_FirstMask(benchmark::State& state, const std::string& prefix) {
  const Demo& demo = GetDemo();
  std::vector<float> logits(demo.tok->vocab_size(), 0.0f);
  for (auto _ : state) {
    state.PauseTiming();
    auto c = GrammarConstraint::ForOutput(Spec(), demo.trie);
    if (!c.ok()) Die(c.status());
    Feed(**c, demo, prefix);
    std::fill(logits.begin(), logits.end(), 0.0f);
    state.ResumeTiming();
    (*c)->Mask(logits);
    benchmark::DoNotOptimize(logits.data());
  }
}

// Per request: the grammar of the turn and the constraint; once per tokenizer: the trie.
void BM_BuildConstraint(benchmark::State& state) {
  const Demo& demo = GetDemo();
  const OutputSpec spec = Spec();
  for (auto _ : state) benchmark::DoNotOptimize(GrammarConstraint::ForOutput(spec, demo.trie));
}
BENCHMARK(BM_BuildConstraint)->Unit(benchmark::kMicrosecond);

void BM_BuildTrie(benchmark::State& state) {
  const Demo& demo = GetDemo();
  for (auto _ : state) benchmark::DoNotOptimize(TokenTrie::Build(*demo.tok));
}
BENCHMARK(BM_BuildTrie)->Unit(benchmark::kMicrosecond);

// The demo checkpoint, kept while the engine reads it.
struct DemoModel {
  ~DemoModel() { std::filesystem::remove_all(dir); }
  std::string dir;
  std::unique_ptr<Engine> engine;
};

void BM_DemoDecodeStep(benchmark::State& state) {
  static DemoModel model;
  if (!model.engine) {
    std::string templ = (std::filesystem::temp_directory_path() / "k3-bench-XXXXXX").string();
    model.dir = ::mkdtemp(templ.data());
    SynthOptions opt;
    opt.preset = "demo";
    opt.out_dir = model.dir;
    if (auto r = Synthesize(opt); !r.ok()) Die(r.status());
    EngineOptions o;
    o.model_dir = model.dir;
    o.max_context = 4096;
    auto engine = Engine::Open(o);
    if (!engine.ok()) Die(engine.status());
    model.engine = *std::move(engine);
  }
  SequenceState seq = model.engine->NewState();
  std::vector<float> logits;
  const std::vector<int32_t> prompt = {3, 7, 11, 5, 9, 13, 17, 19};
  if (auto s = model.engine->Prefill(prompt, seq, logits); !s.ok()) Die(s);
  int32_t id = 21;
  for (auto _ : state) {
    if (auto s = model.engine->Decode(id, seq, logits); !s.ok()) Die(s);
    id = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
}
BENCHMARK(BM_DemoDecodeStep)->Unit(benchmark::kMillisecond)->Iterations(200);

void Register() {
  struct Case {
    const char* name;
    std::string prefix;
  };
  const Case cases[] = {
      {"free_text", "Let me think about"},
      {"json_string", kCall + "{\"title\": \"Buy milk and"},
      {"json_value_start", kCall + "{\"title\": \"x\", \"steps\": ["},
      {"json_number", kCall + "{\"title\": \"x\", \"steps\": [{\"n\": 12"},
  };
  for (const Case& c : cases) {
    for (const bool cache : {false, true}) {
      const std::string name = std::string("BM_Mask/") + c.name + (cache ? "/warm" : "/cold");
      benchmark::RegisterBenchmark(name.c_str(), BM_Mask, c.prefix, cache, false)
          ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark((std::string("BM_Mask/") + c.name + "/near_budget").c_str(),
                                 BM_Mask, c.prefix, true, true)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((std::string("BM_Mask/") + c.name + "/first").c_str(),
                                 BM_FirstMask, c.prefix)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace k3::grammar

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  k3::grammar::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
