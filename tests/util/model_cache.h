// Synthesised models made once per build and shared by every test process that asks for the
// same one. ctest runs each test in a process of its own, so a suite's SetUpTestSuite runs once
// per test: the serve suites wrote the 180 MB demo model again for every test. A shared model
// lives in the build tree (<build>/test-models) under a key of what made it (the synth
// arguments) and the identity of the binary that wrote it (size, modification time and inode),
// so a rebuilt binary never meets an older binary's model; it is written into a temp dir there
// and renamed into place, so that a concurrent test never sees half a model, and the loser of a
// race removes its own copy. The suite's own path is a symlink to it. Tests only read these
// models; a test that changes a model copies it or synthesises its own.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace k3::testing {

inline uint64_t Fnv1a(const std::string& s, uint64_t h = 14695981039346656037ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

inline std::string Hex(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

// Size, modification time and inode: what changes whenever the file is written again.
inline std::string FileIdentity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_ino);
}

// Makes `link` a symlink to the shared model `what`, written by `make(dir)` (which runs
// `writer`) the first time. False, with a test failure, when the model cannot be made.
inline bool LinkSharedModel(const std::string& link, const std::string& what,
                            const std::string& writer,
                            const std::function<bool(const std::string&)>& make) {
  namespace fs = std::filesystem;
  const std::string identity = FileIdentity(writer);
  if (identity.empty()) return make(link);  // no binary to key on: the suite's own copy
  const char* build = std::getenv("K3_BUILD_DIR");
  std::error_code ec;
  const fs::path root = fs::absolute(fs::path(build != nullptr ? build : ".") / "test-models");
  // The stem names the model and the writer's path (two test binaries write their own copies);
  // the suffix its writer as built now.
  const std::string stem = Hex(Fnv1a(what + "\n" + fs::canonical(writer, ec).string()));
  const fs::path model = root / (stem + "." + Hex(Fnv1a(identity, Fnv1a(what))));
  if (!fs::is_directory(model, ec)) {
    fs::create_directories(root, ec);
    std::string temp = (root / ".tmp-XXXXXX").string();
    if (::mkdtemp(temp.data()) == nullptr) {
      ADD_FAILURE() << "cannot make a directory in " << root;
      return false;
    }
    const bool made = make(temp + "/model");
    // Another process may have renamed its copy into place first: then this one goes.
    if (made) std::rename((temp + "/model").c_str(), model.c_str());
    fs::remove_all(temp, ec);
    if (!made) return false;
    if (!fs::is_directory(model, ec)) {
      ADD_FAILURE() << "cannot rename the model to " << model;
      return false;
    }
    // The same model by the same writer as it was built before: never used again.
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with(stem + ".") && entry.path() != model) fs::remove_all(entry.path(), ec);
    }
  }
  fs::create_directory_symlink(model, link, ec);
  EXPECT_FALSE(ec) << "symlink " << link << ": " << ec.message();
  return !ec;
}

}  // namespace k3::testing
