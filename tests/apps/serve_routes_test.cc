// The route table (apps/server/routes.h) against the server: every route answers where the
// table says, /metrics counts each under the table's label and a path of no route under one
// label of its own, and `k3 serve --help` lists them all.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "apps/server/routes.h"
#include "tests/apps/serve_harness.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::ServeProcess;

class ServeRoutesTest : public testing::ServeModelSuite {};

// A path the route's pattern matches: the label, with a file of the page for a wildcard.
std::string PathOf(const server::Route& route) {
  std::string path(route.label);
  if (const size_t star = path.find('*'); star != std::string::npos)
    path.replace(star, 1, "app.js");
  return path;
}

// Each route once, without the key: the public ones answer 200, the others 401, and both are
// counted under the route's label. A path of no route is counted as "other".
TEST_F(ServeRoutesTest, EveryRouteIsCountedUnderItsLabel) {
  ServeProcess server({"-m", model(), "--prompt-cache", "none", "--api-key", "k"});
  for (const server::Route& route : server::RouteTable()) {
    const std::string path = PathOf(route);
    EXPECT_EQ(server::RouteLabel(path), route.label) << path;
    const testing::HttpResult r =
        testing::Curl(server.url(path), {"-X", std::string(route.method)});
    EXPECT_EQ(r.status, route.access == server::Access::kPublic ? 200 : 401)
        << route.method << " " << path << ": " << r.body;
  }
  EXPECT_EQ(testing::Curl(server.url("/no/such/route"), {"-H", "Authorization: Bearer k"}).status,
            404);
  // The log line, and with it the count, comes after the answer: poll until the last is in.
  const std::string other = "k3_http_requests_total{path=\"other\",code=\"404\"}";
  ASSERT_TRUE(testing::WaitForMetric(server, other, 1))
      << testing::Curl(server.url("/metrics")).body;
  const std::string metrics = testing::Curl(server.url("/metrics")).body;
  for (const server::Route& route : server::RouteTable()) {
    const int code = route.access == server::Access::kPublic ? 200 : 401;
    const std::string sample = "k3_http_requests_total{path=\"" + std::string(route.label) +
                               "\",code=\"" + std::to_string(code) + "\"}";
    EXPECT_GE(testing::MetricIn(metrics, sample), 1) << sample << "\n" << metrics;
  }
  EXPECT_EQ(server::RouteLabel("/no/such/route"), server::kOtherLabel);
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

TEST_F(ServeRoutesTest, HelpListsEveryRoute) {
  const testing::K3Result help = testing::RunK3({"serve", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  for (const server::Route& route : server::RouteTable()) {
    EXPECT_THAT(help.out, HasSubstr(std::string(route.label) + " ")) << route.label;
    EXPECT_THAT(help.out, HasSubstr(std::string(route.help))) << route.label;
  }
}

}  // namespace
}  // namespace k3
