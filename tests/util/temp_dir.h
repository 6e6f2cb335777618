// Test helpers shared by the test folders.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace k3::testing {

// A fresh directory under $TMPDIR, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "k3-test-XXXXXX").string();
    path_ = ::mkdtemp(templ.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Directory of the shared fixtures (../shared from the repository root, or $K3_SHARED_DIR).
inline std::string SharedDir() {
  const char* env = std::getenv("K3_SHARED_DIR");
  return env != nullptr ? env : "../shared";
}

}  // namespace k3::testing
