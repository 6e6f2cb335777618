// main() of every GoogleTest binary: fills in the environment the tests read (where the shared
// fixtures, the k3 binary, Debian's python and the build tree are) from the values CMake baked
// in, unless the caller set them. ctest cannot pass several variables through
// gtest_discover_tests, and a test binary run by hand should work too.
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  const char* defaults[][2] = {{"K3_SHARED_DIR", K3_TEST_SHARED_DIR},
                               {"K3_PYTHON", K3_TEST_PYTHON},
                               {"K3_BIN", K3_TEST_BIN},
                               {"K3_SOURCE_DIR", K3_TEST_SOURCE_DIR},
                               {"K3_BUILD_DIR", K3_TEST_BUILD_DIR}};
  for (const auto& [name, value] : defaults) ::setenv(name, value, /*overwrite=*/0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
