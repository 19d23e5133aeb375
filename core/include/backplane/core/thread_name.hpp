// Names for the threads Backplane starts, as `top -H`, `perf` and `gdb` show them: every thread
// of a process is otherwise called after its executable ("backplane"), and a profile then cannot
// tell the batcher's dispatcher from a reaper or an HTTP I/O thread.
#pragma once

#include <pthread.h>

namespace backplane {

// Names the calling thread; Linux keeps 15 characters ("bp-" and the thread's role).
inline void NameThisThread(const char* name) {
  pthread_setname_np(pthread_self(), name);
}

}  // namespace backplane
