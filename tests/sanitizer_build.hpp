// Whether this test binary is built with a sanitizer, for the tests that scale their work or
// their bounds to it. GCC defines __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__; clang (14) does
// not, and answers __has_feature instead: testing only the first would silently treat a clang
// sanitizer build as a plain one.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define BACKPLANE_ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BACKPLANE_ASAN_BUILD 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define BACKPLANE_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BACKPLANE_TSAN_BUILD 1
#endif
#endif
