#include "cli/heap_trim.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace backplane::server {

// Measured with bench/body_burst.sh (VmRSS in MiB, before / peak / after the burst plus 3 s;
// medians of 3 runs, except the twice-on-one-server case: one run each with body_burst.py;
// release build, 2-core VM, Debian 12, glibc 2.36):
//
// - Partial bodies, 16 clients x 15 of 16 MiB, twice on one server: the second burst left
//   210 MiB resident (30 before) once glibc's dynamic threshold had risen past 16 MiB after the
//   first; with the threshold fixed at 1 MiB both bursts left 30.
// - 20,000 HTTP/2 HEADERS+RST_STREAM on gRPC: 31 / 445 / 445 MiB; glibc's tunables did not help
//   (arena_max=1: 433 after, arena_max=2: 430, trim_threshold=0: 437), the memory being free but
//   fragmented across arenas; malloc_trim(0) gave back 363 -> 50 MiB. With this trim on
//   serve's timer: 31 / 428 / 53 (434 after without it, same bench, same machine).
// - 64 clients x 15 of 16 MiB (the budget's case): 31 / 272 / 32 with the budget, 31 / 992 / 32
//   without; the first burst on a fresh server already gave its memory back.
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
