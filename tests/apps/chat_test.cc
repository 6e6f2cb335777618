// k3 chat end to end through the binary, driven by a pipe: the state kept between turns is
// the state a single run over the whole conversation builds, and a turn feeds only its own
// new tokens.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/str_join.h"
#include "core/text/chat_template.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/turn_parser.h"
#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;
using Ids = std::vector<int32_t>;

constexpr char kFirst[] = "Hello there";
constexpr char kSecond[] = "What is the capital of France?";

class ChatTest : public ::testing::Test {
 protected:
  // Two small models with a tokenizer, made once per build (tests/util/model_cache.h): the
  // second differs in shape, hence in fingerprint.
  static void SetUpTestSuite() {
    models_ = new testing::TempDir;
    for (const char* layers : {"2", "3"}) {
      ASSERT_TRUE(testing::LinkK3Model(
          *models_ / layers,
          {"--preset", "demo", "--set", std::string("num_hidden_layers=") + layers, "--set",
           "full_attn_layers=2"}));
    }
  }
  static void TearDownTestSuite() { delete models_; }

  static std::string Model() { return *models_ / "2"; }
  static std::string OtherModel() { return *models_ / "3"; }

  testing::K3Result Chat(const std::vector<std::string>& flags, const std::string& input) {
    std::vector<std::string> args = {"chat", "--model", Model(), "-n", "6"};
    args.insert(args.end(), flags.begin(), flags.end());
    return RunK3(args, input);
  }

  nlohmann::json Json(const std::string& name) {
    return nlohmann::json::parse(testing::ReadAll(dir_ / name));
  }

  Ids Render(const std::vector<ChatMessage>& messages, const ChatOptions& options = {}) {
    auto tok = Tokenizer::Load(Model());
    EXPECT_TRUE(tok.ok()) << tok.status();
    auto ids = RenderChat(*tok, messages, options);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return *ids;
  }

  // What must close a reply before the next message: the last token when the reply did not
  // end at a stop token (it was shown but never run), then what closes the channels and the
  // message the reply left open (core/text/tools/turn_parser.h), ending <|close|>message<|sep|>
  // <|end_of_msg|>.
  Ids Closing(const Ids& reply) {
    auto tok = Tokenizer::Load(Model());
    const int32_t eom = *tok->SpecialTokenId("<|end_of_msg|>");
    const int32_t eos = *tok->SpecialTokenId("[EOS]");
    const bool stopped = !reply.empty() && (reply.back() == eom || reply.back() == eos);
    TurnParser parser(*tok, OutputSpec{});
    for (size_t i = 0; i + (stopped ? 1 : 0) < reply.size(); ++i) parser.Feed(reply[i]);
    Ids closing = stopped || reply.empty() ? Ids{} : Ids{reply.back()};
    const Ids tail = parser.ClosingIds();
    closing.insert(closing.end(), tail.begin(), tail.end());
    Ids message_end = {*tok->SpecialTokenId("<|close|>")};
    for (int32_t id : tok->Encode("message", false)) message_end.push_back(id);
    message_end.insert(message_end.end(), {*tok->SpecialTokenId("<|sep|>"), eom});
    EXPECT_TRUE(std::equal(message_end.rbegin(), message_end.rend(), closing.rbegin()));
    return closing;
  }

  static testing::TempDir* models_;
  testing::TempDir dir_;
};

testing::TempDir* ChatTest::models_ = nullptr;

Ids Concat(std::initializer_list<Ids> parts) {
  Ids all;
  for (const Ids& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

TEST_F(ChatTest, SecondTurnFeedsOnlyItsNewTokensAndMatchesOneRunOverTheConversation) {
  auto r = Chat({"--report-json", dir_ / "turns.json"}, absl::StrCat(kFirst, "\n", kSecond, "\n"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json turns = Json("turns.json");
  ASSERT_EQ(turns.size(), 2u);
  const Ids fed1 = turns[0]["prompt_ids"], reply1 = turns[0]["generated_ids"];
  const Ids fed2 = turns[1]["prompt_ids"], reply2 = turns[1]["generated_ids"];
  ASSERT_FALSE(reply1.empty());
  ASSERT_FALSE(reply2.empty());

  EXPECT_EQ(fed1, Render({{.role = "user", .content = kFirst}}));
  // Turn 2 runs what closes reply 1 and the new message, nothing of turn 1.
  const Ids new_tokens =
      Concat({Closing(reply1), Render({{.role = "user", .content = kSecond}}, {.head = false})});
  EXPECT_EQ(fed2, new_tokens);
  EXPECT_EQ(turns[1]["position_before"], fed1.size() + reply1.size() - 1);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("[turn 2: ", new_tokens.size(), " tokens in")));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("[turn 1: ", fed1.size(), " tokens in")));

  // One generate over the whole conversation continues exactly as the kept state did.
  const Ids whole = Concat({fed1, Ids(reply1.begin(), reply1.end() - 1), fed2});
  auto g = RunK3({"generate", "--model", Model(), "--ids", absl::StrJoin(whole, ","), "-n", "6",
                  "--quiet", "--report-json", dir_ / "generate.json"});
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(Json("generate.json")["generated_ids"], nlohmann::json(reply2));
}

TEST_F(ChatTest, ResetStartsTheConversationOverWithTheSystemMessage) {
  auto r = Chat({"--quiet", "--system", "Be brief.", "--report-json", dir_ / "turns.json"},
                absl::StrCat(kFirst, "\n/reset\n", kFirst, "\n/exit\n", kSecond, "\n"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json turns = Json("turns.json");
  ASSERT_EQ(turns.size(), 2u);  // nothing after /exit
  EXPECT_EQ(turns[0]["prompt_ids"],
            nlohmann::json(Render({{.role = "system", .content = "Be brief."},
                                   {.role = "user", .content = kFirst}})));
  EXPECT_EQ(turns[1]["position_before"], 0);
  EXPECT_EQ(turns[1]["prompt_ids"], turns[0]["prompt_ids"]);
  EXPECT_EQ(turns[1]["generated_ids"], turns[0]["generated_ids"]);
  EXPECT_EQ(r.err, "");  // --quiet
}

TEST_F(ChatTest, HistoryResumesWithTheReplyOfAnUnbrokenConversation) {
  auto unbroken = Chat({"--quiet", "--history", dir_ / "a.json", "--report-json", dir_ / "a.r"},
                       absl::StrCat(kFirst, "\n", kSecond, "\n"));
  ASSERT_EQ(unbroken.exit_code, 0) << unbroken.err;
  auto first = Chat({"--quiet", "--history", dir_ / "b.json"}, absl::StrCat(kFirst, "\n"));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  auto resumed = Chat({"--history", dir_ / "b.json", "--report-json", dir_ / "b.r"},
                      absl::StrCat(kSecond, "\n"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_THAT(resumed.err, HasSubstr("[resumed " + dir_ / "b.json"));

  EXPECT_EQ(Json("b.r")[0]["generated_ids"], Json("a.r")[1]["generated_ids"]);
  EXPECT_EQ(Json("b.r")[0]["prompt_ids"],
            nlohmann::json(Render({{.role = "user", .content = kSecond}}, {.head = false})));
  const nlohmann::json a = Json("a.json"), b = Json("b.json");
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["messages"], b["messages"]);
  ASSERT_EQ(a["messages"].size(), 4u);
  EXPECT_EQ(a["messages"][2]["content"], kSecond);
  EXPECT_EQ(a["messages"][3]["role"], "assistant");
}

// --prompt-cache: a new conversation with the same system prompt resumes its state (the head
// every such conversation shares), and a resumed --history its last turn's state; the replies
// are those of runs without the cache.
TEST_F(ChatTest, APromptCacheKeepsTheSystemPromptAndAResumedHistory) {
  const std::string cache = dir_ / "cache";
  const std::vector<std::string> system = {"--quiet", "--system", "Be brief."};
  auto with = [&](std::vector<std::string> flags, const std::string& report) {
    flags.insert(flags.end(), {"--prompt-cache", cache, "--report-json", dir_ / report});
    return flags;
  };
  auto plain = [&](std::vector<std::string> flags, const std::string& report) {
    flags.insert(flags.end(), {"--report-json", dir_ / report});
    return flags;
  };
  ASSERT_EQ(Chat(with(system, "a.r"), absl::StrCat(kFirst, "\n")).exit_code, 0);
  auto b = Chat(with(system, "b.r"), absl::StrCat(kSecond, "\n"));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  ASSERT_EQ(Chat(plain(system, "c.r"), absl::StrCat(kSecond, "\n")).exit_code, 0);
  EXPECT_EQ(Json("a.r")[0]["cached_tokens"], 0);
  auto tok = Tokenizer::Load(Model());
  ASSERT_TRUE(tok.ok());
  const std::vector<ChatMessage> head = {{.role = "system", .content = "Be brief."}};
  EXPECT_EQ(Json("b.r")[0]["cached_tokens"],
            RenderChat(*tok, head, {.add_generation_prompt = false})->size());
  EXPECT_EQ(Json("b.r")[0]["generated_ids"], Json("c.r")[0]["generated_ids"]);

  const std::vector<std::string> history = {"--quiet", "--history", dir_ / "h.json"};
  ASSERT_EQ(Chat(with(history, "h1.r"), absl::StrCat(kFirst, "\n")).exit_code, 0);
  auto resumed = Chat(with(history, "h2.r"), absl::StrCat(kSecond, "\n"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  ASSERT_EQ(Chat(plain({"--quiet"}, "u.r"), absl::StrCat(kFirst, "\n", kSecond, "\n")).exit_code,
            0);
  EXPECT_EQ(Json("h2.r")[0]["generated_ids"], Json("u.r")[1]["generated_ids"]);
}

TEST_F(ChatTest, CorruptHistoryIsRefusedNamingTheFileAndLeftUntouched) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"format": "k3-chat-history", "tokens": [1, 2)", "invalid JSON"},
      {R"({"format": "k3-chat-history", "version": 1, "model_fingerprint": "x"})",
       "saved with another model"},
      {R"(["not", "a", "history"])", "no \"format\""},
  };
  for (const auto& [contents, message] : cases) {
    std::ofstream(dir_ / "h.json") << contents;
    auto r = Chat({"--quiet", "--history", dir_ / "h.json"}, absl::StrCat(kFirst, "\n"));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(dir_ / "h.json"));
    EXPECT_THAT(r.err, HasSubstr(message));
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(testing::ReadAll(dir_ / "h.json"), contents);
  }
}

TEST_F(ChatTest, TokensOutsideTheVocabularyMakeAHistoryCorrupt) {
  ASSERT_EQ(Chat({"--quiet", "--history", dir_ / "h.json"}, "hi\n").exit_code, 0);
  nlohmann::json h = Json("h.json");
  h["tokens"].push_back(1 << 30);
  const std::string contents = h.dump();
  std::ofstream(dir_ / "h.json") << contents;
  auto r = Chat({"--quiet", "--history", dir_ / "h.json"}, "again\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("not a token id below"));
  EXPECT_EQ(testing::ReadAll(dir_ / "h.json"), contents);
}

TEST_F(ChatTest, HistoryOfAnotherModelIsRefusedAndLeftUntouched) {
  ASSERT_EQ(Chat({"--quiet", "--history", dir_ / "h.json"}, "hi\n").exit_code, 0);
  const std::string saved = testing::ReadAll(dir_ / "h.json");
  auto r =
      RunK3({"chat", "--model", OtherModel(), "--quiet", "--history", dir_ / "h.json"}, "hi\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(dir_ / "h.json"));
  EXPECT_THAT(r.err, HasSubstr("saved with another model"));
  EXPECT_EQ(testing::ReadAll(dir_ / "h.json"), saved);
}

// The polls below return as soon as what they wait for has happened; their bound of a minute
// only turns a broken build's hang into a failure, far above what a sanitizer build on a loaded
// machine takes.
constexpr int kPolls = 6000;
constexpr std::chrono::milliseconds kPollInterval(10);

// Polls `path` until it holds `text` (any text when empty; true) or the bound passes (false).
bool WaitForText(const std::string& path, const std::string& text) {
  for (int i = 0; i < kPolls; ++i) {
    const std::string contents = testing::ReadAll(path);
    if (text.empty() ? !contents.empty() : contents.find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(kPollInterval);
  }
  return false;
}

// Polls until the main thread of `pid` is blocked reading its standard input (the chat is at
// its prompt), so that a signal sent next interrupts that read. A fixed pause could end while the
// chat is still saving the turn, or between its check of the Ctrl-C flag and the read.
bool WaitForPromptRead(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/syscall";
  for (int i = 0; i < kPolls; ++i) {
    std::ifstream in(path);
    long number = -1;
    std::string fd;
    if (in >> number >> fd && number == SYS_read && fd == "0x0") return true;
    std::this_thread::sleep_for(kPollInterval);
  }
  return false;
}

TEST_F(ChatTest, CtrlCStopsTheReplyAndAtThePromptExits130) {
  int in[2];
  ASSERT_EQ(::pipe(in), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, in[1]);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir_ / "out").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (dir_ / "err").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  // A reply long enough to be interrupted: thousands of tokens.
  std::vector<std::string> args = {
      std::getenv("K3_BIN"), "chat",  "--model",   Model(),        "-n", "20000",
      "--max-context",       "25000", "--history", dir_ / "h.json"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ASSERT_EQ(::write(in[1], "hello\n", 6), 6);

  ASSERT_TRUE(WaitForText(dir_ / "out", "")) << "no reply began";
  ::kill(pid, SIGINT);
  EXPECT_TRUE(WaitForText(dir_ / "err", "interrupted]")) << testing::ReadAll(dir_ / "err");
  EXPECT_TRUE(WaitForPromptRead(pid)) << "not back at the prompt";
  ::kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::close(in[1]);
  ASSERT_TRUE(WIFEXITED(status)) << testing::ReadAll(dir_ / "err");
  EXPECT_EQ(WEXITSTATUS(status), 130);
  // The interrupted turn was kept: the history holds it.
  const nlohmann::json history = Json("h.json");
  ASSERT_EQ(history["messages"].size(), 2u);
  EXPECT_EQ(history["messages"][0]["content"], "hello");
}

TEST_F(ChatTest, ModelWithoutATokenizerIsAUsageError) {
  auto r = RunK3({"chat", "--model", testing::SharedDir() + "/fixtures/reference-tiny"}, "hi\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("tiktoken.model does not exist"));
}

}  // namespace
}  // namespace k3
