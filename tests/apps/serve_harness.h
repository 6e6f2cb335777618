// What the k3 serve tests share: the server as a child process on a free loopback port, curl,
// the OpenAI and Anthropic Node SDKs (tests/apps/*.cjs), /metrics, and `k3 generate` alone for
// the ids every answer must equal.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "core/text/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/source_path.h"
#include "tests/util/temp_dir.h"

namespace k3::testing {

using json = nlohmann::json;

// `k3 serve --port 0 ARGS` in the background, stderr to a file; the port from its
// "listening on" line. Stop() sends SIGTERM and returns the exit code (Signal and Wait apart,
// to watch it drain).
class ServeProcess {
 public:
  explicit ServeProcess(std::vector<std::string> args) {
    // The prompt cache in the test's own directory, not the user's, unless a test names one.
    if (std::find(args.begin(), args.end(), "--prompt-cache") == args.end()) {
      args.insert(args.end(), {"--prompt-cache", dir_ / "prompt-cache"});
    }
    args.insert(args.begin(), {K3Bin(), "serve", "--port", "0"});
    log_ = dir_ / "serve.err";
    pid_ = fork();
    if (pid_ == 0) {
      freopen("/dev/null", "r", stdin);
      freopen((dir_ / "serve.out").c_str(), "w", stdout);
      freopen(log_.c_str(), "w", stderr);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // Generous: the engine opens its model first. The port is known at once after that.
    static const std::regex kListening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 1200 && port_ == 0; ++i) {
      std::smatch m;
      const std::string text = ReadAll(log_);
      if (std::regex_search(text, m, kListening)) port_ = std::stoi(m[1]);
      int status = 0;
      if (port_ == 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "k3 serve exited at start: " << text;
        return;
      }
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (port_ == 0) ADD_FAILURE() << "k3 serve did not start: " << ReadAll(log_);
  }
  ~ServeProcess() {
    if (pid_ > 0) Stop();
  }

  int Stop() {
    Signal(SIGTERM);
    return Wait();
  }
  void Signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
  }
  // Until the server exits: its exit code (128 + the signal that killed it).
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  int port() const { return port_; }
  std::string url(const std::string& path = "") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  std::string log() const { return ReadAll(log_); }

 private:
  TempDir dir_;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

struct HttpResult {
  int status = 0;
  std::string body;
  std::string headers;
};

// curl ARGS URL: the status, the body and the response headers.
inline HttpResult Curl(const std::string& url, const std::vector<std::string>& args = {}) {
  TempDir io;
  std::string cmd = "curl -s -o " + ShellQuote(io / "body") + " -D " + ShellQuote(io / "head") +
                    " -w '%{http_code}'";
  for (const std::string& a : args) cmd.append(" ").append(ShellQuote(a));
  cmd += " " + ShellQuote(url) + " > " + ShellQuote(io / "code");
  std::system(cmd.c_str());
  HttpResult r;
  const std::string code = ReadAll(io / "code");
  r.status = code.empty() ? 0 : std::stoi(code);
  r.body = ReadAll(io / "body");
  r.headers = ReadAll(io / "head");
  return r;
}

inline HttpResult PostJson(const ServeProcess& s, const std::string& path, const std::string& body,
                           std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"-H", "Content-Type: application/json", "--data-binary", body};
  args.insert(args.end(), extra.begin(), extra.end());
  return Curl(s.url(path), args);
}

// The value of one sample ("name{labels}") in the text of /metrics, or -1 when it is absent.
inline double MetricIn(const std::string& text, const std::string& sample) {
  const std::string key = sample + " ";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + key.size()));
  }
  return -1;
}

// The same, scraped from the server now.
inline double Metric(const ServeProcess& s, const std::string& sample) {
  return MetricIn(Curl(s.url("/metrics")).body, sample);
}

// Polls /metrics until `sample` reaches `value` (a minute at most, for a loaded machine).
inline bool WaitForMetric(const ServeProcess& s, const std::string& sample, double value) {
  for (int i = 0; i < 1200; ++i) {
    if (Metric(s, sample) == value) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Polls GET `path` until it answers `status` (a minute at most, for a loaded machine).
inline bool WaitForStatus(const ServeProcess& s, const std::string& path, int status) {
  for (int i = 0; i < 1200; ++i) {
    if (Curl(s.url(path)).status == status) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Streaming completions by curl in the background, each into its own file.
class Streams {
 public:
  ~Streams() { Kill(); }
  void Start(const ServeProcess& server, const json& body) {
    const std::string out = io_ / std::to_string(count_++);
    const std::string cmd = "curl -sN -H 'Content-Type: application/json' --data-binary " +
                            testing::ShellQuote(body.dump()) + " " + server.url("/v1/completions") +
                            " > " + out + " 2>&1 & echo $! >> " + io_ / "pids";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  std::string Output(int i) const { return testing::ReadAll(io_ / std::to_string(i)); }
  // Until every curl has ended (a minute at most): whether they did.
  bool WaitAll() const {
    const std::string wait = "for i in $(seq 1200); do alive=0; for p in $(cat " + io_ / "pids" +
                             "); do kill -0 $p 2>/dev/null && alive=1; done; "
                             "[ $alive = 0 ] && exit 0; sleep 0.05; done; exit 1";
    return std::system(wait.c_str()) == 0;
  }
  // Ends the curls started so far (their clients gone, as a disconnect).
  void Kill() {
    if (count_ == 0) return;
    const std::string pids = io_ / "pids";
    std::system(("kill $(cat " + pids + ") 2>/dev/null; : > " + pids).c_str());
  }

 private:
  testing::TempDir io_;
  int count_ = 0;
};

// Runs requests through a client script (tests/apps/*.cjs) of the npm `packages`, all at once,
// against `base_url`; one result each.
inline json NodeScript(const std::string& script_name, const std::vector<std::string>& packages,
                       const std::string& base_url, const json& requests) {
  const char* build = std::getenv("K3_BUILD_DIR");
  const std::string oracle = std::string(build != nullptr ? build : "build") + "/oracle";
  const std::string script = testing::SourcePath("tests/apps/" + script_name);
  for (const std::string& package : packages) {
    if (!std::ifstream(oracle + "/node_modules/" + package + "/package.json")) {
      ADD_FAILURE() << "the npm package " << package << " is not in " << oracle
                    << " (scripts/setup-deps.sh installs it)";
      return json::array();
    }
  }
  TempDir io;
  std::ofstream(io / "requests.json") << requests.dump();
  const std::string cmd = "node " + ShellQuote(script) + " " + ShellQuote(oracle) + " " +
                          ShellQuote(base_url) + " " + ShellQuote(io / "requests.json") + " " +
                          ShellQuote(io / "out.json");
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  const std::string out = ReadAll(io / "out.json");
  return out.empty() ? json::array() : json::parse(out);
}

// Runs requests through the OpenAI Node SDK, all at once; one result each (serve_client.cjs).
inline json NodeClients(const ServeProcess& s, const json& requests) {
  return NodeScript("serve_client.cjs", {"openai", "ajv"}, s.url("/v1"), requests);
}

// The same through Anthropic's TypeScript SDK (anthropic_client.cjs), which appends
// /v1/messages to the server's root.
inline json AnthropicClients(const ServeProcess& s, const json& requests) {
  return NodeScript("anthropic_client.cjs", {"@anthropic-ai/sdk", "ajv"}, s.url(), requests);
}

// The ids that close a think channel and open the response, as a thinking budget forces them.
inline std::vector<int32_t> ThinkClosingIds(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  auto add = [&](const char* marker, const char* tag) {
    ids.push_back(*tok.SpecialTokenId(marker));
    for (int32_t id : tok.Encode(tag, false)) ids.push_back(id);
    ids.push_back(*tok.SpecialTokenId("<|sep|>"));
  };
  add("<|close|>", "think");
  add("<|open|>", "response");
  return ids;
}

// The demo model (what `make run` generates on) at `dir`; `layers` > 0 cuts it to that many
// layers (the same tokenizer and chat template, quicker to run). Made once per build and
// shared by every serve test (tests/util/model_cache.h): `dir` is a symlink to it, which the
// tests only read. 0 when it is there.
inline int SynthServeModel(const std::string& dir, int layers = 2) {
  std::vector<std::string> args = {"--preset", "demo"};
  if (layers > 0) {
    args.insert(args.end(), {"--set", "num_hidden_layers=" + std::to_string(layers), "--set",
                             "full_attn_layers=" + std::to_string(layers)});
  }
  return LinkK3Model(dir, args) ? 0 : 1;
}

// A suite whose tests serve a two-layer demo model, made once (SynthServeModel): model().
class ServeModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    ASSERT_EQ(SynthServeModel(model()), 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string model() { return *dir_ / "m"; }
  static inline TempDir* dir_ = nullptr;
};

// `k3 generate` of the same ids alone: its generated ids.
inline json GenerateAlone(const std::string& model, const json& prompt_ids, int n,
                          const std::vector<std::string>& sampling) {
  TempDir io;
  std::string ids;
  for (const auto& id : prompt_ids) {
    if (!ids.empty()) ids.push_back(',');
    ids.append(std::to_string(id.get<int>()));
  }
  std::vector<std::string> args = {"generate",      "-m",         model, "--quiet",
                                   "--ids",         ids,          "-n",  std::to_string(n),
                                   "--report-json", io / "r.json"};
  args.insert(args.end(), sampling.begin(), sampling.end());
  const K3Result r = RunK3(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string text = ReadAll(io / "r.json");
  return text.empty() ? json() : json::parse(text)["generated_ids"];
}

}  // namespace k3::testing
