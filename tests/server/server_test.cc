// The parts of k3 serve below HTTP (apps/server/): the OpenAI request parser, the reply text
// with stop strings, the saved states, and the GenerationService that drives the batch from
// many threads (also run under TSan). The HTTP side with real clients: tests/apps/serve_*.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "apps/server/generation_service.h"
#include "apps/server/openai_request.h"
#include "apps/server/reply_text.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/turn_parser.h"
#include "tests/util/tiny_model.h"

namespace k3::server {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(OpenAiRequestTest, ReadsAChatRequestWithTheApiDefaults) {
  const ParseResult r = ParseCompletionRequest(
      R"({"model": "m", "messages": [{"role": "developer", "content": "Be brief."},
          {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
          {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}],
          "stream": true, "stream_options": {"include_usage": true}, "stop": "END", "seed": 5})",
      Endpoint::kChat);
  ASSERT_TRUE(r.request) << r.error->message;
  const CompletionRequest& c = *r.request;
  ASSERT_EQ(c.messages.size(), 3u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[1].content, "Hi there");
  EXPECT_EQ(c.messages[2].thinking, "greet");
  EXPECT_TRUE(c.stream && c.include_usage && c.seeded);
  EXPECT_EQ(c.stop, std::vector<std::string>{"END"});
  EXPECT_FALSE(c.sampler.greedy);  // temperature 1, top_p 1, no top-k: the API's defaults
  EXPECT_EQ(c.sampler.temperature, 1.0);
  EXPECT_EQ(c.sampler.top_p, 1.0);
  EXPECT_EQ(c.sampler.top_k, 0);
  EXPECT_FALSE(c.max_tokens.has_value());
}

TEST(OpenAiRequestTest, ReadsPromptsAsTextIdsOrAListOfOne) {
  for (const char* body : {R"({"prompt": [1, 2, 3], "temperature": 0})",
                           R"({"prompt": [[1, 2, 3]], "temperature": 0.0})"}) {
    const ParseResult r = ParseCompletionRequest(body, Endpoint::kCompletion);
    ASSERT_TRUE(r.request) << body;
    EXPECT_EQ(r.request->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_TRUE(r.request->sampler.greedy);
  }
  const ParseResult text =
      ParseCompletionRequest(R"({"prompt": ["once"], "max_tokens": 3.0})", Endpoint::kCompletion);
  ASSERT_TRUE(text.request);
  EXPECT_EQ(*text.request->prompt_text, "once");
  EXPECT_EQ(*text.request->max_tokens, 3);
  EXPECT_FALSE(text.request->ignore_eos);
  const ParseResult all =
      ParseCompletionRequest(R"({"prompt": "x", "ignore_eos": true})", Endpoint::kCompletion);
  ASSERT_TRUE(all.request);
  EXPECT_TRUE(all.request->ignore_eos);  // as vLLM: the stop ids do not end it
}

TEST(OpenAiRequestTest, NeutralValuesOfUnsupportedOptionsAreAccepted) {
  const ParseResult r = ParseCompletionRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "n": 1, "presence_penalty": 0,
          "logprobs": false, "tools": [], "response_format": {"type": "text"}, "user": "u"})",
      Endpoint::kChat);
  EXPECT_TRUE(r.request) << r.error->message;
}

TEST(OpenAiRequestTest, EndpointsDoNotTakeEachOthersFields) {
  EXPECT_EQ(ParseCompletionRequest(R"({"prompt": "x"})", Endpoint::kChat).error->param, "prompt");
  EXPECT_EQ(ParseCompletionRequest(R"({"messages": []})", Endpoint::kCompletion).error->param,
            "messages");
}

TEST(OpenAiRequestTest, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt": "x", "max_tokens": -1})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1e30})", "max_tokens"},
      {R"({"prompt": "x", "seed": 1.5})", "seed"},
      {R"({"prompt": "x", "top_p": 0})", "top_p"},
      {R"({"prompt": "x", "stop": [""]})", "stop"},
      {R"({"prompt": [-1]})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": "x", "stream_options": {"x": 1}})", "stream_options.x"},
      {R"({"prompt": "x", "model": 5})", "model"},
      {R"({"prompt": "x", "logprobs": 6})", "logprobs"},
      {R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos"},
  };
  for (const auto& [body, param] : cases) {
    const ParseResult r = ParseCompletionRequest(body, Endpoint::kCompletion);
    ASSERT_TRUE(r.error) << body;
    EXPECT_EQ(r.error->param, param) << body;
    EXPECT_EQ(r.error->http_status, 400);
    EXPECT_EQ(r.error->ToJson()["error"]["param"], param);
  }
  const ParseResult m = ParseCompletionRequest(
      R"({"messages": [{"role": "user", "content": "x", "color": "red"}]})", Endpoint::kChat);
  ASSERT_TRUE(m.error);
  EXPECT_EQ(m.error->param, "messages[0].color");
  const ParseResult t = ParseCompletionRequest(
      R"({"messages": [{"role": "tool", "content": "x"}]})", Endpoint::kChat);
  ASSERT_TRUE(t.error);
  EXPECT_EQ(t.error->param, "messages[0].tool_call_id");
}

TEST(Utf8Test, APrefixEndsOnAWholeCharacter) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3"), 1u);      // the first byte of é
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3\xA9"), 3u);  // é
  EXPECT_EQ(CompleteUtf8Prefix("\xE2\x82"), 0u);   // two of €'s three bytes
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x98\x80"), 4u);
  EXPECT_EQ(CompleteUtf8Prefix("\x80\x80"), 2u);  // stray continuation bytes never complete
  EXPECT_EQ(CompleteUtf8Prefix("a\xFF"), 2u);     // nor does a byte that leads nothing
}

class ReplyTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions o;
    o.preset = "demo";
    o.out_dir = dir_ / "m";
    o.overrides = {{"num_hidden_layers", "2"}, {"full_attn_layers", "2"}};
    ASSERT_TRUE(Synthesize(o).ok());
    auto tok = Tokenizer::Load(dir_ / "m");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_.emplace(*std::move(tok));
  }
  std::vector<int32_t> Ids(const std::string& text) { return tok_->Encode(text, true); }
  // All of a reply's content, fed a token at a time.
  std::string Content(ReplyText& r, const std::vector<int32_t>& ids,
                      std::vector<std::string>* deltas = nullptr) {
    std::string all;
    for (int32_t id : ids) {
      const std::string d = r.Add(id).content;
      if (deltas && !d.empty()) deltas->push_back(d);
      all += d;
    }
    return all + r.Finish().content;
  }
  testing::TempDir dir_;
  std::optional<Tokenizer> tok_;
};

TEST_F(ReplyTextTest, AStopStringCutsTheTextAndNothingOfItIsEverStreamed) {
  ReplyText r(*tok_, /*chat=*/false, {}, {"the end", "zz"});
  std::vector<std::string> deltas;
  EXPECT_EQ(Content(r, Ids("and so it was the end of it"), &deltas), "and so it was ");
  EXPECT_TRUE(r.stopped());
  for (const std::string& d : deltas) EXPECT_THAT(d, ::testing::Not(HasSubstr("the")));
  ReplyText none(*tok_, false, {}, {"never"});
  EXPECT_EQ(Content(none, Ids("the text whole")), "the text whole");
  EXPECT_FALSE(none.stopped());
}

TEST_F(ReplyTextTest, MultiByteCharactersAreNeverSplitAndStopIdsAddNoText) {
  const std::vector<int32_t> ids = Ids("d\xC3\xA9j\xC3\xA0 vu \xE2\x82\xAC");
  const int32_t eos = *tok_->SpecialTokenId("[EOS]");
  std::vector<int32_t> with_stop = ids;
  with_stop.push_back(eos);
  ReplyText r(*tok_, false, {eos}, {});
  std::vector<std::string> deltas;
  EXPECT_EQ(Content(r, with_stop, &deltas), "d\xC3\xA9j\xC3\xA0 vu \xE2\x82\xAC");
  for (const std::string& d : deltas) EXPECT_EQ(CompleteUtf8Prefix(d), d.size()) << d;
}

TEST_F(ReplyTextTest, AChatReplySplitsIntoReasoningAndContent) {
  std::vector<int32_t> ids = Ids("let me think<|close|>think<|sep|><|open|>response<|sep|>Hi!");
  ReplyText r(*tok_, /*chat=*/true, {}, {});
  std::string reasoning, content;
  for (int32_t id : ids) {
    ReplyText::Delta d = r.Add(id);
    reasoning += d.reasoning;
    content += d.content;
  }
  content += r.Finish().content;
  EXPECT_EQ(reasoning, "let me think");
  EXPECT_EQ(content, "Hi!");
}

TEST_F(ReplyTextTest, AChatReplyWithToolsCarriesItsCallsAndStopStringsCutOnlyContent) {
  OutputSpec spec;
  spec.tools.push_back({.name = "get_time"});
  // Markers as special ids, as the model samples them; the rest ordinary text.
  const std::vector<int32_t> ids =
      Ids("END here<|close|>think<|sep|><|open|>response<|sep|>It is<|close|>response<|sep|>"
          "<|open|>tools<|sep|><|open|>call tool=\"get_time\" index=\"1\"<|sep|><|open|>"
          "argument key=\"tz\" type=\"string\"<|sep|>UTC<|close|>argument<|sep|><|close|>call"
          "<|sep|><|close|>tools<|sep|><|close|>message<|sep|>");
  ReplyText r(*tok_, spec, {}, {"END", "zz"}, /*id_seed=*/3);
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  for (int32_t id : ids) {
    ReplyText::Delta d = r.Add(id);
    reasoning += d.reasoning;
    content += d.content;
    calls.insert(calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  }
  ReplyText::Delta last = r.Finish();
  content += last.content;
  EXPECT_TRUE(last.tool_calls.empty());
  EXPECT_EQ(reasoning, "END here");
  EXPECT_EQ(content, "It is");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, R"({"tz":"UTC"})");
  const ParsedTurn turn = r.result();
  EXPECT_EQ(turn.content, "It is");
  ASSERT_EQ(turn.tool_calls.size(), 1u);
  EXPECT_EQ(turn.tool_calls[0].id, calls[0].id);
  EXPECT_EQ(turn.FinishReason(false), "tool_calls");
  EXPECT_FALSE(r.stopped());
}

TEST_F(ReplyTextTest, AChatReplyCutAtAStopStringAndOneWithNoContent) {
  ReplyText cut(*tok_, OutputSpec{}, {}, {"is"});
  for (int32_t id : Ids("r<|close|>think<|sep|>This is it")) cut.Add(id);
  cut.Finish();
  EXPECT_TRUE(cut.stopped());
  EXPECT_EQ(cut.result().content, "Th");
  EXPECT_EQ(cut.result().reasoning_content, "r");
  OutputSpec spec;
  spec.tools.push_back({.name = "f"});
  ReplyText calls(*tok_, spec, {}, {});
  for (int32_t id : Ids("<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|close|>call<|sep|>")) {
    calls.Add(id);
  }
  calls.Finish();
  EXPECT_EQ(calls.result().content, std::nullopt);
  EXPECT_EQ(calls.result().tool_calls.size(), 1u);
  // A completion has no parse.
  ReplyText raw(*tok_, /*chat=*/false, {}, {});
  raw.Add(Ids("x")[0]);
  EXPECT_TRUE(raw.result().tool_calls.empty());
}

class GenerationServiceTest : public testing::TinyModelSuite {
 protected:
  static EngineOptions Options(int sequences) {
    EngineOptions o;
    o.model_dir = ModelDir();
    o.prefill_chunk = 4;
    o.max_context = 48;
    o.sequences = sequences;
    return o;
  }
  // `batch` places and `max_queue` waiting; the chunk and context are the suite's engine's.
  static ServiceOptions Shape(int batch, int max_queue, PromptCache* cache = nullptr) {
    return {.batch = {.batch = batch}, .max_queue = max_queue, .prompt_cache = cache};
  }
  // A prompt cache of `states` in memory, and in `dir` unless it is empty.
  static std::unique_ptr<PromptCache> Cache(const Engine& engine, size_t states,
                                            const std::string& dir = "") {
    auto cache = PromptCache::Open(engine.config(), "tiny", {.dir = dir, .memory_states = states});
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? *std::move(cache) : nullptr;
  }
  static BatchRequest Request(std::vector<int32_t> prompt, int n, uint64_t seed) {
    BatchRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = n;
    r.sampler.greedy = false;
    r.sampler.seed = seed;
    return r;
  }
  static std::vector<int32_t> Alone(Engine& engine, const BatchRequest& r) {
    std::vector<int32_t> ids;
    BatchScheduler s(engine, {.batch = 1}, {.on_done = [&](BatchResult& res) { ids = res.ids; }});
    EXPECT_TRUE(s.Add(r).ok());
    EXPECT_TRUE(s.Run().ok());
    return ids;
  }
  static Job::Progress Finish(Job& job) {
    std::vector<int32_t> ids;
    for (;;) {
      Job::Progress p = job.Wait(ids.size(), milliseconds(100));
      ids.insert(ids.end(), p.ids.begin(), p.ids.end());
      if (p.done) {
        p.ids = ids;
        return p;
      }
    }
  }
};

TEST_F(GenerationServiceTest, ManyThreadsSubmittingAtOnceEachGetTheirTokensAlone) {
  auto engine = Engine::Open(Options(6));
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto cache = Cache(**engine, 3);
  GenerationService service(**engine, Shape(3, 8, cache.get()));
  std::vector<BatchRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(Request({3, 5, int32_t(7 + i), 2}, 5 + i, 40 + i));
  std::vector<std::vector<int32_t>> got(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      auto job = service.Submit(requests[i]);
      ASSERT_TRUE(job.ok()) << job.status();
      const Job::Progress p = Finish(**job);
      EXPECT_TRUE(p.status.ok()) << p.status;
      got[i] = p.ids;
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i], Alone(**engine, requests[i])) << i;
  const ServiceStats st = service.stats();
  EXPECT_EQ(st.requests_finished, 8);
  EXPECT_EQ(st.live, 0);
}

// Draining (SIGTERM in k3 serve): a new job is refused as unavailable, the live one and the one
// waiting for its place run to their end with the tokens they get alone.
TEST_F(GenerationServiceTest, ADrainRefusesNewJobsWhileThoseInFlightFinish) {
  auto engine = Engine::Open(Options(1));
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerationService service(**engine, Shape(1, 4));
  const std::vector<BatchRequest> requests = {Request({3, 5, 7}, 12, 1), Request({3, 5, 8}, 12, 2)};
  auto a = service.Submit(requests[0]);
  auto b = service.Submit(requests[1]);
  ASSERT_TRUE(a.ok() && b.ok());
  service.Drain();
  const auto late = service.Submit(Request({4}, 2, 3));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(late.status().message()), ::testing::HasSubstr("draining"));
  EXPECT_TRUE(service.stats().draining);
  const Job::Progress pa = Finish(**a);
  const Job::Progress pb = Finish(**b);
  EXPECT_TRUE(pa.status.ok() && pb.status.ok()) << pa.status << pb.status;
  EXPECT_EQ(pa.ids, Alone(**engine, requests[0]));
  EXPECT_EQ(pb.ids, Alone(**engine, requests[1]));
  EXPECT_EQ(service.in_flight(), 0);
  // The usage gauge's terms: nothing live now, one place's state at the planned context.
  const ServiceStats st = service.stats();
  EXPECT_EQ(st.live_state_bytes, 0u);
  EXPECT_EQ(st.state_bytes_capacity, (*engine)->plan().state_bytes);
  EXPECT_EQ(st.places, 1);
}

TEST_F(GenerationServiceTest, AnExtendingRequestResumesAndGetsTheSameTokens) {
  auto engine = Engine::Open(Options(3));
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto cache = Cache(**engine, 2);
  GenerationService service(**engine, Shape(1, 4, cache.get()));
  const BatchRequest first = Request({9, 8, 7, 6, 5}, 4, 1);
  auto a = service.Submit(first);
  ASSERT_TRUE(a.ok());
  const Job::Progress pa = Finish(**a);
  BatchRequest next = Request(first.prompt, 6, 2);
  next.prompt.insert(next.prompt.end(), pa.ids.begin(), pa.ids.end());
  next.prompt.insert(next.prompt.end(), {11, 12});
  auto b = service.Submit(next);
  ASSERT_TRUE(b.ok());
  const Job::Progress pb = Finish(**b);
  // The state at the first request's end holds all of its tokens but the last.
  EXPECT_EQ(pb.cached_tokens, static_cast<int64_t>(first.prompt.size() + pa.ids.size() - 1));
  EXPECT_EQ(pb.prompt_tokens, static_cast<int64_t>(next.prompt.size()));
  EXPECT_EQ(pb.ids, Alone(**engine, next));
}

// A restart: a new service over the same cache directory resumes the request it ran before a
// token short of its prompt's end, and the one after its answer, with the same tokens.
TEST_F(GenerationServiceTest, AfterARestartTheCacheDirectoryResumesEarlierPrompts) {
  auto engine = Engine::Open(Options(3));
  ASSERT_TRUE(engine.ok()) << engine.status();
  testing::TempDir dir;
  const BatchRequest first = Request({9, 8, 7, 6, 5, 4, 3}, 4, 1);
  std::vector<int32_t> first_ids;
  {
    auto cache = Cache(**engine, 2, dir.path());
    GenerationService service(**engine, Shape(1, 4, cache.get()));
    auto a = service.Submit(first);
    ASSERT_TRUE(a.ok());
    first_ids = Finish(**a).ids;
  }
  auto cache = Cache(**engine, 2, dir.path());
  GenerationService service(**engine, Shape(1, 4, cache.get()));
  auto again = service.Submit(first);
  ASSERT_TRUE(again.ok());
  const Job::Progress pa = Finish(**again);
  EXPECT_EQ(pa.cached_tokens, static_cast<int64_t>(first.prompt.size() - 1));
  EXPECT_EQ(pa.ids, first_ids);
  BatchRequest next = Request(first.prompt, 5, 2);
  next.prompt.insert(next.prompt.end(), first_ids.begin(), first_ids.end());
  next.prompt.push_back(11);
  auto b = service.Submit(next);
  ASSERT_TRUE(b.ok());
  const Job::Progress pb = Finish(**b);
  EXPECT_EQ(pb.cached_tokens, static_cast<int64_t>(first.prompt.size() + first_ids.size() - 1));
  EXPECT_EQ(pb.ids, Alone(**engine, next));
  EXPECT_GE(cache->stats().disk_hits, 1);
}

TEST_F(GenerationServiceTest, AFullQueueIsRefusedACancelEndsAJobAndStopEndsTheRest) {
  auto engine = Engine::Open(Options(1));
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerationService service(**engine, Shape(1, 1));
  auto live = service.Submit(Request({1, 2}, 40, 1));
  ASSERT_TRUE(live.ok());
  (*live)->Wait(0, milliseconds(60000));  // it has its first token: it holds the one place
  auto waiting = service.Submit(Request({3, 4}, 40, 2));
  ASSERT_TRUE(waiting.ok());
  auto refused = service.Submit(Request({5, 6}, 2, 3));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max-queue 1"));
  auto too_long = service.Submit(Request(std::vector<int32_t>(48, 1), 1, 4));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  (*live)->Cancel();
  const Job::Progress cancelled = Finish(**live);
  EXPECT_EQ(cancelled.finish, FinishReason::kInterrupted);
  EXPECT_LT(cancelled.ids.size(), 40u);
  (*waiting)->Wait(0, milliseconds(60000));  // admitted in the freed place
  service.Stop();
  const Job::Progress stopped = Finish(**waiting);
  EXPECT_EQ(stopped.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service.Submit(Request({1}, 1, 1)).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace k3::server
