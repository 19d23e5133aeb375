#include "cli/heap_trim.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace backplane::server {

// What bench/body_burst.sh showed (the numbers are in docs/operators.md, "After a burst", and
// docs/performance.md):
//
// - Partial bodies, twice on one server: once glibc's dynamic mmap threshold had risen past the
//   body size after the first burst, the second burst's bodies stayed in the heap, resident after
//   they were freed; with the threshold fixed at 1 MiB both bursts gave their memory back.
// - A flood of HTTP/2 HEADERS+RST_STREAM on gRPC: the memory was free but fragmented across
//   glibc's per-thread arenas; glibc's tunables (arena_max, trim_threshold) did not return it, and
//   malloc_trim(0) did. Hence the trim on serve's timer.
// - Many clients with partial bodies (the budget's case): the first burst on a fresh server already
//   gave its memory back; what bounds the peak is the body budget (body_budget.hpp).
//
// A threshold of 1 MiB costs a mapping and its page faults for each block of 1 MiB or more
// (request bodies and large tensors); not measured, expected small next to reading that many
// bytes from a socket.
void ConfigureAllocator() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}

std::size_t TrimFreeHeap(std::size_t min_free_bytes) {
#if defined(__GLIBC__)
  const struct mallinfo2 info = mallinfo2();
  if (info.fordblks <= min_free_bytes)
    return 0;
  malloc_trim(0);
  return info.fordblks;
#else
  (void)min_free_bytes;
  return 0;
#endif
}

}  // namespace backplane::server
