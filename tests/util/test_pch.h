// The headers the test programs share, precompiled once for all of them (tests/CMakeLists.txt):
// parsing GoogleTest, gmock, nlohmann/json and Abseil's status types was about 8 of the 9-20 s
// a test file took to compile. Each test file still includes what it uses.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
