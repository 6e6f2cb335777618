// Whether this test binary runs under a sanitizer, for the few tests whose figures (memory,
// speed) a sanitizer changes.
#pragma once

namespace k3::testing {

// GCC defines __SANITIZE_*__; clang before 16 only answers __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace k3::testing
