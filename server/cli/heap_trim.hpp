// Keeps the resident memory of `backplane serve` near what is in use after a burst. glibc keeps
// memory that was freed: large blocks in its heaps once its dynamic mmap threshold has risen past
// them, and small ones fragmented across its per-thread arenas, where only malloc_trim gives them
// back. Both shown by bench/body_burst.sh (the numbers are in docs/operators.md, "After a burst").
// No-ops on a C library other than glibc. Not thread-safe to configure: ConfigureAllocator runs
// once, before the server's threads start.
#pragma once

#include <chrono>
#include <cstddef>

namespace backplane::server {

// Fixes glibc's mmap threshold (M_MMAP_THRESHOLD), which also turns off its dynamic raising:
// blocks of a request body's size are then mapped and unmapped on their own, never kept.
void ConfigureAllocator();

// How often serve looks at the heap, and how much free memory it lets glibc keep.
inline constexpr std::chrono::seconds kHeapTrimPeriod{2};
inline constexpr std::size_t kHeapTrimMinFreeBytes = std::size_t{64} << 20;

// Gives free heap memory back to the system (malloc_trim) when glibc holds more than
// `min_free_bytes` of it free in its arenas; returns the free bytes it held before, 0 when it
// did not trim. Thread-safe (glibc locks each arena in turn); costs a walk of the free lists,
// so it is called from a timer, not per request.
std::size_t TrimFreeHeap(std::size_t min_free_bytes);

}  // namespace backplane::server
