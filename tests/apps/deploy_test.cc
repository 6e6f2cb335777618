// deploy/ without a cluster: the Kubernetes manifests and the image recipe, read by
// tests/apps/deploy_manifests.py (PyYAML), agree with each other (labels, ports, the picker's
// service, the grace period against the drain, memory against --ram-gb), name only flags k3 serve
// has, and hold against a running server: the probes' paths answer, readiness turns 503 while
// draining and liveness does not, and every metric the endpoint picker is told to read is on
// /metrics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "tests/apps/serve_harness.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::json;
using testing::ServeProcess;

// deploy_manifests.py's summary of deploy/.
json Manifests() {
  testing::TempDir io;
  const std::string cmd =
      "/usr/bin/python3 " +
      testing::ShellQuote(testing::SourcePath("tests/apps/deploy_manifests.py")) + " " +
      testing::ShellQuote(testing::SourcePath(".")) + " > " + testing::ShellQuote(io / "out.json");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string out = testing::ReadAll(io / "out.json");
  return out.empty() ? json::object() : json::parse(out);
}

// The value of "--name=value" in `args`, or "" when it is absent.
std::string Arg(const json& args, const std::string& name) {
  for (const json& a : args) {
    const std::string s = a.get<std::string>();
    if (s.starts_with(name + "=")) return s.substr(name.size() + 1);
  }
  return "";
}

// A Kubernetes quantity in bytes: decimal (G, M) or binary (Gi, Mi) suffixes.
double Bytes(const std::string& quantity) {
  static const std::regex kQuantity("([0-9.]+)(Gi|Mi|G|M)?");
  std::smatch m;
  if (!std::regex_match(quantity, m, kQuantity)) return -1;
  const double n = std::stod(m[1]);
  const std::string unit = m[2];
  return unit == "Gi"   ? n * (1ull << 30)
         : unit == "Mi" ? n * (1ull << 20)
         : unit == "G"  ? n * 1e9
         : unit == "M"  ? n * 1e6
                        : n;
}

TEST(DeployTest, TheManifestsAndTheImageAgreeWithEachOther) {
  const json m = Manifests();
  ASSERT_TRUE(m.contains("replicas")) << m.dump();
  const json& r = m["replicas"];
  const json& g = m["gateway"];
  // The pool, the Service and the Deployment select the same pods, on the port k3 listens on.
  EXPECT_EQ(g["pool_selector"], r["pod_labels"]);
  EXPECT_EQ(r["service_selector"], r["pod_labels"]);
  const int port = r["ports"].value("http", -1);
  EXPECT_EQ(Arg(r["args"], "--port"), std::to_string(port));
  EXPECT_EQ(Arg(r["args"], "--host"), "0.0.0.0");
  EXPECT_EQ(g["pool_ports"], json::array({port}));
  for (const char* probe : {"startup", "readiness", "liveness"}) {
    EXPECT_EQ(r[probe]["port"], "http") << probe;
  }
  EXPECT_EQ(g["pool_api_version"], "inference.networking.k8s.io/v1");
  EXPECT_EQ(g["picker"]["name"], g["picker_service"]);
  EXPECT_THAT(g["picker_service_ports"].get<std::vector<int>>(),
              ::testing::Contains(g["picker"]["port"]["number"].get<int>()));
  ASSERT_EQ(g["route_backends"].size(), 1u);
  EXPECT_EQ(g["route_backends"][0]["kind"], "InferencePool");
  EXPECT_EQ(g["route_backends"][0]["name"], g["pool_name"]);
  const std::string config = Arg(g["picker_args"], "--config-file");
  EXPECT_TRUE(g["picker_config"].contains(config.substr(config.rfind('/') + 1))) << config;
  EXPECT_EQ(Arg(g["picker_args"], "--pool-name"), g["pool_name"].get<std::string>());

  // The kubelet's SIGKILL comes after the preStop pause and the whole drain.
  const double drain = std::stod(Arg(r["args"], "--drain-seconds"));
  EXPECT_GT(drain, 0);
  const std::string pre_stop = r["pre_stop"].get<std::string>();
  EXPECT_THAT(pre_stop, HasSubstr("kill -TERM 1"));
  std::smatch pause;
  const double paused =
      std::regex_search(pre_stop, pause, std::regex("sleep ([0-9]+);")) ? std::stod(pause[1]) : 0;
  EXPECT_GT(r["grace_seconds"].get<double>(), paused + drain);

  // Memory: an explicit budget, the request equal to the limit and above the budget plus k3's
  // fixed 64 MiB (docs/MEMORY.md).
  const std::string ram_gb = Arg(r["args"], "--ram-gb");
  ASSERT_FALSE(ram_gb.empty()) << "the replicas need an explicit --ram-gb";
  EXPECT_EQ(Arg(r["args"], "--preset"), "");
  EXPECT_EQ(r["memory_request"], r["memory_limit"]);
  EXPECT_GE(Bytes(r["memory_request"].get<std::string>()),
            std::stod(ram_gb) * 1e9 + 64.0 * (1 << 20));

  const json& image = m["image"];
  EXPECT_EQ(image["base"], "debian:12");
  EXPECT_TRUE(image["installs_with_setup_deps_run"].get<bool>());
  EXPECT_TRUE(image["builds_release"].get<bool>());
  EXPECT_THAT(image["entrypoint"][0].get<std::string>(), ::testing::EndsWith("/k3"));
}

TEST(DeployTest, TheReplicasArgumentsAreFlagsOfK3Serve) {
  const json m = Manifests();
  ASSERT_TRUE(m.contains("replicas")) << m.dump();
  const json& args = m["replicas"]["args"];
  ASSERT_FALSE(args.empty());
  EXPECT_EQ(args[0], "serve");
  const testing::K3Result help = testing::RunK3({"serve", "--help"});
  for (const json& a : args) {
    const std::string s = a.get<std::string>();
    if (!s.starts_with("--")) continue;
    const std::string name = s.substr(0, s.find('='));
    EXPECT_THAT(help.out + help.err, HasSubstr("  " + name + " ")) << name;
  }
}

TEST(DeployTest, TheProbesAndThePickersMetricsHoldAgainstTheServer) {
  const json m = Manifests();
  ASSERT_TRUE(m.contains("replicas")) << m.dump();
  const json& r = m["replicas"];
  testing::TempDir dir;
  ASSERT_EQ(testing::SynthServeModel(dir / "m"), 0);
  ServeProcess server({"-m", dir / "m", "--batch", "1", "--drain-seconds", "600"});
  for (const char* probe : {"startup", "readiness", "liveness"}) {
    EXPECT_EQ(testing::Curl(server.url(r[probe]["path"].get<std::string>())).status, 200) << probe;
  }
  // Every metric the picker reads, as the gauge the protocol asks for; the prefix scorer's
  // labels on the cache info.
  const std::string metrics = testing::Curl(server.url("/metrics")).body;
  int named = 0;
  for (const json& a : m["gateway"]["picker_args"]) {
    const std::string s = a.get<std::string>();
    const size_t eq = s.find('=');
    if (s.find("-metric=") == std::string::npos) continue;
    const std::string name = s.substr(eq + 1);
    if (name.empty()) continue;  // a metric the picker is told not to read (LoRA)
    ++named;
    EXPECT_THAT(metrics, HasSubstr("# TYPE " + name + " gauge\n")) << s;
  }
  EXPECT_EQ(named, 4);
  EXPECT_EQ(Arg(m["gateway"]["picker_args"], "--lora-info-metric"), "");
  const std::string info = Arg(m["gateway"]["picker_args"], "--cache-info-metric");
  EXPECT_THAT(metrics, HasSubstr(info + "{block_size=\""));
  EXPECT_THAT(metrics, HasSubstr(",num_gpu_blocks=\""));

  // Draining: readiness fails (out of the pool), liveness does not (no restart mid-drain).
  testing::Streams streams;
  streams.Start(
      server, {{"prompt", "hold"}, {"max_tokens", 100000}, {"stream", true}, {"ignore_eos", true}});
  ASSERT_TRUE(testing::WaitForMetric(server, "vllm:num_requests_running", 1));
  server.Signal(SIGTERM);
  EXPECT_TRUE(testing::WaitForStatus(server, r["readiness"]["path"].get<std::string>(), 503))
      << server.log();
  EXPECT_EQ(testing::Curl(server.url(r["liveness"]["path"].get<std::string>())).status, 200);
  streams.Kill();  // its client gone, the drain ends at once
  EXPECT_EQ(server.Wait(), 0) << server.log();
  EXPECT_THAT(server.log(), HasSubstr("drained, stopping"));
}

}  // namespace
}  // namespace k3
