#include "shape_program_builder.hpp"

#include <spdlog/spdlog.h>

#include <thread>
#include <utility>

#include "backplane/core/backend_call.hpp"
#include "backplane/core/thread_name.hpp"

namespace backplane {

ShapeProgramBuilder::ShapeProgramBuilder(std::size_t queue_capacity)
    : queue_capacity_(queue_capacity), thread_([this] {
        NameThisThread("bp-shape-queue");
        Loop();
      }) {}

ShapeProgramBuilder::~ShapeProgramBuilder() {
  Shutdown();
}

bool ShapeProgramBuilder::Submit(std::function<void()> build) {
  {
    MutexLock lock(mutex_);
    if (!stopping_ && queue_.size() < queue_capacity_) {
      queue_.push_back(std::move(build));
      wake_.notify_one();
      return true;
    }
  }
  build = nullptr;  // refused: destroyed here, outside the lock (it may release a claim)
  return false;
}

void ShapeProgramBuilder::Shutdown() {
  std::deque<std::function<void()>> dropped;
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  wake_.notify_all();
  dropped.clear();  // outside the lock: a build's destruction releases its claim
  if (thread_.joinable())
    thread_.join();
}

void ShapeProgramBuilder::Loop() {
  MutexLock lock(mutex_);
  for (;;) {
    while (!stopping_ && queue_.empty())
      wake_.wait(mutex_);
    if (stopping_)
      return;
    std::function<void()> build = std::move(queue_.front());
    queue_.pop_front();
    MutexUnlock unlocked(mutex_);
    // Each build on a thread of its own that ends with it. Trap: a thread that ran backend code
    // keeps that code's thread-local runtime state while it lives; CpuAcc's OpenMP (libgomp)
    // keeps a team per thread, and while more team threads exist than cores, every team's idle
    // threads stop spinning and sleep, so each parallel region of a request pays futex wake-ups
    // (at intra_op_threads 2 that made a ResNet-like request several times slower; the numbers are
    // in docs/performance.md, from bench/ort_compare.sh). A thread costs far less than a build.
    std::thread([&build] {
      NameThisThread("bp-shape-build");
      // A build that throws (out of memory) has released its claim on the way out; the next
      // request of that shape queues it again.
      GuardBackendCall(build, [](std::string_view what) {
        spdlog::error("shape program builder: a build threw: {}", what);
      });
      build = nullptr;  // destroyed on the thread that ran it, before it ends
    }).join();
  }
}

}  // namespace backplane
