#include "kernels/dispatch.h"

#include <gtest/gtest.h>

#include <string_view>

namespace k3::kernels {
namespace {

TEST(Dispatch, PicksTheBestSupportedTargetAndCanBeForced) {
  const std::vector<int64_t> targets = AvailableKernelTargets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(ActiveKernelTarget(), KernelTargetName(targets.front()));
  for (int64_t target : targets) {
    ForceKernelTarget(target);
    EXPECT_EQ(ActiveKernelTarget(), KernelTargetName(target));
  }
  ForceKernelTarget(0);
  EXPECT_EQ(ActiveKernelTarget(), KernelTargetName(targets.front()));
}

#if defined(__x86_64__) && defined(__GNUC__)
// The build has no -march flag; runtime dispatch must still reach AVX-512 where the CPU has it.
TEST(Dispatch, UsesAvx512WhenTheCpuHasIt) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl")) {
    GTEST_SKIP() << "no AVX-512 on this CPU";
  }
  EXPECT_EQ(ActiveKernelTarget(), "AVX3");
}
#endif

}  // namespace
}  // namespace k3::kernels
