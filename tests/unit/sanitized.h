#pragma once

// Whether this test binary runs under AddressSanitizer or ThreadSanitizer. Those check memory and threads,
// not arithmetic, and run element-wise reference loops 20-50x slower: tests of large buffers use smaller
// ones there (still above every threshold they exist to cross).

namespace gradscope::testing {

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

}  // namespace gradscope::testing
