// Runs the `k3` binary under test ($K3_BIN) and captures its exit code and output.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/model_cache.h"
#include "tests/util/temp_dir.h"

namespace k3::testing {

struct K3Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string K3Bin() {
  const char* bin = std::getenv("K3_BIN");
  return bin != nullptr ? bin : "k3";
}

inline K3Result RunK3(const std::vector<std::string>& args, const std::string& stdin_text = "") {
  TempDir io;
  std::string cmd = ShellQuote(K3Bin());
  for (const std::string& a : args) cmd.append(" ").append(ShellQuote(a));
  {
    std::ofstream in(io / "in");
    in << stdin_text;
  }
  cmd +=
      " <" + ShellQuote(io / "in") + " >" + ShellQuote(io / "out") + " 2>" + ShellQuote(io / "err");
  int status = std::system(cmd.c_str());
  K3Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadAll(io / "out");
  r.err = ReadAll(io / "err");
  return r;
}

// Runs `script` with /bin/sh, $K3 set to the binary under test; captures exit code and output.
inline K3Result RunShell(const std::string& script) {
  TempDir io;
  const std::string cmd = "K3=" + ShellQuote(K3Bin()) + " /bin/sh -c " + ShellQuote(script) + " >" +
                          ShellQuote(io / "out") + " 2>" + ShellQuote(io / "err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  K3Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadAll(io / "out");
  r.err = ReadAll(io / "err");
  return r;
}

// `k3 synth ARGS --quiet` by the binary under test, shared: `link` points to it.
inline bool LinkK3Model(const std::string& link, const std::vector<std::string>& synth_args) {
  std::string what = "k3 synth";
  for (const std::string& a : synth_args) what.append(" ").append(ShellQuote(a));
  return LinkSharedModel(link, what, K3Bin(), [&](const std::string& out) {
    std::vector<std::string> args = {"synth", "--out", out, "--quiet"};
    args.insert(args.end(), synth_args.begin(), synth_args.end());
    const K3Result r = RunK3(args);
    EXPECT_EQ(r.exit_code, 0) << what << ": " << r.err;
    return r.exit_code == 0;
  });
}

// A suite's tiny checkpoint, made with the binary under test (`k3 synth --preset tiny`), shared
// by the test processes of the build (tests/util/model_cache.h) and linked into the suite's
// temp dir: Model(). The suite's tests only read it.
class K3TinyModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    ASSERT_TRUE(LinkK3Model(Model(), {"--preset", "tiny"}));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Model() { return *dir_ / "model"; }
  static inline TempDir* dir_ = nullptr;
};

}  // namespace k3::testing
