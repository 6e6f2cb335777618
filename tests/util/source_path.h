// Where a test finds the repository's own files: K3_SOURCE_DIR, which the test programs' main()
// sets from the path CMake baked in (tests/util/test_main.cc) unless the caller set it.
#pragma once

#include <cstdlib>
#include <string>

namespace k3::testing {

// `relative` (a path inside the repository) under K3_SOURCE_DIR.
inline std::string SourcePath(const std::string& relative) {
  const char* root = std::getenv("K3_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/" + relative;
}

}  // namespace k3::testing
