#include "kernels/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/targets.h"

HWY_BEFORE_NAMESPACE();
namespace k3::kernels::HWY_NAMESPACE {
namespace {

// Which per-target variant the dispatch picked, asked the same way the kernels are called.
int64_t CompiledTarget() { return HWY_TARGET; }

}  // namespace
}  // namespace k3::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3::kernels {

HWY_EXPORT(CompiledTarget);

std::vector<int64_t> AvailableKernelTargets() { return hwy::SupportedAndGeneratedTargets(); }

std::string_view KernelTargetName(int64_t target) { return hwy::TargetName(target); }

std::string_view ActiveKernelTarget() {
  return KernelTargetName(HWY_DYNAMIC_DISPATCH(CompiledTarget)());
}

void ForceKernelTarget(int64_t target) { hwy::SetSupportedTargetsForTest(target); }

}  // namespace k3::kernels
#endif  // HWY_ONCE
