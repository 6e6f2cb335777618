// The files of the page `k3 serve` shows (apps/server/page/), compiled into the binary by the
// build (page/embed_assets.cmake), so that the page works offline and with no files beside k3.
#pragma once

#include <string_view>
#include <vector>

namespace k3::server {

struct PageAsset {
  std::string_view name;          // the file's base name: index.html, app.js, ...
  std::string_view content_type;  // with charset=utf-8 for text
  std::string_view bytes;
};

// Every file of the page, in the order the build listed them.
const std::vector<PageAsset>& PageAssets();

}  // namespace k3::server
