// --volume directories for tests: a model's shards hard-linked into another directory (copied
// where a link would cross file systems), which `DIR@PROFILE` then makes a drive of its own.
#pragma once

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace k3::testing {

// Links (or copies) every *.safetensors file of `model` into `dir`, made if needed; the number
// of files.
inline int LinkShards(const std::string& model, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  int n = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(fs::canonical(model))) {
    if (e.path().extension() != ".safetensors") continue;
    const fs::path to = fs::path(dir) / e.path().filename();
    std::error_code ec;
    fs::create_hard_link(e.path(), to, ec);
    if (ec) fs::copy_file(e.path(), to, fs::copy_options::overwrite_existing);
    ++n;
  }
  EXPECT_GT(n, 0) << model;
  return n;
}

}  // namespace k3::testing
