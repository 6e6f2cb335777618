// k3 serve's page over HTTP (the browser drives it in tests/browser/page_test.cjs): every file
// of apps/server/page/ is served from the binary with its content type and the
// Content-Security-Policy, the page names only files the server has (nothing from elsewhere),
// /k3/info says what the page needs, and the page's routes need no API key where the API does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "tests/apps/serve_harness.h"
#include "tests/util/source_path.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::json;
using ::testing::Not;
using testing::ServeProcess;

constexpr char kPolicy[] =
    "Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'\r\n";

using ServePageTest = testing::ServeModelSuite;

std::string TypeOf(const std::string& name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  return "text/css; charset=utf-8";
}

TEST_F(ServePageTest, ServesEveryFileOfThePageFromTheBinary) {
  ServeProcess server({"-m", model(), "--prompt-cache", "none"});
  int files = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(testing::SourcePath("apps/server/page"))) {
    const std::string name = entry.path().filename();
    if (!name.ends_with(".html") && !name.ends_with(".js") && !name.ends_with(".css")) continue;
    ++files;
    const std::string path = name == "index.html" ? "/" : "/assets/" + name;
    const testing::HttpResult r = testing::Curl(server.url(path));
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.body, testing::ReadAll(entry.path())) << path;
    EXPECT_THAT(r.headers, HasSubstr("Content-Type: " + TypeOf(name) + "\r\n")) << path;
    EXPECT_THAT(r.headers, HasSubstr(kPolicy)) << path;
  }
  EXPECT_GE(files, 8);
  const testing::HttpResult pipeline = testing::Curl(server.url("/pipeline"));
  EXPECT_EQ(pipeline.status, 200);
  EXPECT_EQ(pipeline.body, testing::Curl(server.url("/")).body);
  EXPECT_THAT(pipeline.headers, HasSubstr(kPolicy));
  for (const char* missing : {"/assets/nothing.js", "/assets/index.html"}) {
    const testing::HttpResult r = testing::Curl(server.url(missing));
    EXPECT_EQ(r.status, 404) << missing;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "unknown_url") << missing;
  }
}

// Each script and sheet index.html names is one the server has, and none is from elsewhere;
// the page has no inline script or style (the policy would block them).
TEST_F(ServePageTest, ThePageNamesOnlyItsOwnFiles) {
  ServeProcess server({"-m", model(), "--prompt-cache", "none"});
  const std::string html = testing::Curl(server.url("/")).body;
  static const std::regex kRef(R"((src|href)="([^"]*)\")");
  int refs = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), kRef); it != std::sregex_iterator();
       ++it) {
    const std::string url = (*it)[2];
    if (url == "data:," || url == "/" || url == "/pipeline") continue;
    ++refs;
    ASSERT_TRUE(url.starts_with("/assets/")) << url;
    EXPECT_EQ(testing::Curl(server.url(url)).status, 200) << url;
  }
  EXPECT_GE(refs, 3);
  EXPECT_THAT(html, Not(HasSubstr("style=")));
  EXPECT_THAT(html, Not(HasSubstr("<style")));
  EXPECT_THAT(html, Not(HasSubstr("<script>")));
}

TEST_F(ServePageTest, InfoAndThePageNeedNoKeyWhereTheApiDoes) {
  ServeProcess server({"-m", model(), "--prompt-cache", "none", "--api-key", "k"});
  for (const char* path : {"/", "/pipeline", "/assets/app.js", "/k3/info"}) {
    EXPECT_EQ(testing::Curl(server.url(path)).status, 200) << path;
  }
  EXPECT_EQ(testing::Curl(server.url("/v1/models")).status, 401);
  EXPECT_EQ(testing::Curl(server.url("/k3/events")).status, 401);
  const testing::HttpResult info = testing::Curl(server.url("/k3/info"));
  EXPECT_THAT(info.headers, HasSubstr("Content-Type: application/json\r\n"));
  const json j = json::parse(info.body);
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["api_key_required"], true);
  EXPECT_GT(j["context"].get<int64_t>(), 0);
  EXPECT_EQ(j["max_tokens_default"], 32);  // --n-predict's default
}

TEST_F(ServePageTest, InfoSaysWhenNoKeyIsAsked) {
  ServeProcess server({"-m", model(), "--prompt-cache", "none", "--n-predict", "7"});
  const json j = json::parse(testing::Curl(server.url("/k3/info")).body);
  EXPECT_EQ(j["api_key_required"], false);
  EXPECT_EQ(j["max_tokens_default"], 7);
}

}  // namespace
}  // namespace k3
