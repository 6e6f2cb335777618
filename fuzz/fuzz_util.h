// Helpers shared by the fuzz targets: cutting one input into several files, and a private
// scratch directory for the parsers that only read from paths.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace k3::fuzzing {

// Inputs that hold several files separate them with this line, so that a seed stays readable
// and the mutator can still grow or shrink each part on its own.
inline constexpr std::string_view kPartSeparator = "\n--k3--\n";

// Cuts `data` into exactly `n` parts (missing parts are empty; extra separators stay in the
// last part).
inline std::vector<std::string_view> SplitParts(std::string_view data, size_t n) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    size_t at = data.find(kPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + kPartSeparator.size());
  }
  parts.push_back(data);
  parts.resize(n);
  return parts;
}

// One directory per fuzzing process, emptied for every input and removed at exit. In memory
// (/dev/shm) where there is one, since the parsers under test fsync what they write; else
// under $TMPDIR.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    std::error_code ec;
    if (std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) {
      base = "/dev/shm";
    }
    path_ = base / ("k3-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  // Removes everything from the previous input.
  void Clear() const {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(path_, ec)) {
      std::filesystem::remove_all(entry.path(), ec);
    }
  }

  std::string Write(const std::string& name, std::string_view contents) const {
    std::filesystem::path p = path_ / name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

// The scratch directory of this process (created on first use, removed at a normal exit).
inline const ScratchDir& Scratch() {
  static const ScratchDir dir;
  return dir;
}

}  // namespace k3::fuzzing
