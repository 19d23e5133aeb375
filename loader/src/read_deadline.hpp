// Reads that give up waiting. Private to the loader.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

namespace backplane::loader {

// Runs `read` on a thread of its own and waits at most `timeout` for what it returns; nullopt when
// it has not returned by then.
//
// Why: a read from a stalled network or FUSE file system blocks in the kernel for as long as the
// server behind it does not answer, and no flag (O_NONBLOCK included) or signal short of a fatal
// one ends it. The loader reads under the registry's change lock, so one such file would stop
// every deploy, reload and rollback of the process. Past the deadline the caller goes on and the
// thread is abandoned: it finishes, freeing what it read, when the file system answers or is
// unmounted. `read` must therefore own everything it touches (capture by value).
template <typename Read>
auto ReadWithDeadline(std::chrono::milliseconds timeout, Read read)
    -> std::optional<decltype(read())> {
  using Value = decltype(read());
  auto task = std::make_shared<std::packaged_task<Value()>>(std::move(read));
  std::future<Value> result = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (result.wait_for(timeout) != std::future_status::ready)
    return std::nullopt;
  return result.get();
}

}  // namespace backplane::loader
