// A compiled run of layers: oneDNN primitives created once, executed many times concurrently.
//
// A Program is a list of steps over values. A value is a dnnl memory descriptor plus where its
// bytes live: a boundary input or output (the host's buffer, given per request), a constant
// (owned by the program, already in the layout its primitive wants), or a temporary at a fixed
// offset of a per-request workspace. Several values may share bytes (a Reshape inside a run is
// the same bytes under other dims).
//
// Execution needs per-request state (memory objects bound to this request's pointers, the
// workspace, the scratchpad, a stream). It lives in an ExecContext; contexts are pooled per
// program, so that a request in the steady state allocates nothing on the heap and creates no
// dnnl object: it takes a context, points the boundary memories at the host's tensors, runs the
// primitives through the C API with prebuilt argument arrays, and gives the context back.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backplane/sdk/backend.hpp"
#include "oneapi/dnnl/dnnl.hpp"
#include "pool_kernel.hpp"

namespace backplane::cpu_acc {

// The calling thread's OpenMP thread count, set for the duration of a scope and restored after.
// omp_set_num_threads sets a per-thread ICV: it bounds the OpenMP team a oneDNN primitive starts
// from this thread and nothing else, so concurrent requests with their own counts do not mix.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads);
  ~ScopedOmpThreads();
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int previous_;
};

// The calling thread's libgomp worker pool, fitted before the thread starts OpenMP teams of up
// to `threads` (a program's run, or a compile, whose weight reorders run teams too).
//
// Traps kept in mind here:
//  - libgomp keeps a pool of workers per thread that starts parallel regions (here: every thread
//    that calls Execute), as big as its largest recent team, until that thread exits. A team of
//    one never touches the pool, so lowering intra_op_threads to 1 left every request thread's
//    workers alive, and idle workers still cost every later team. So a thread entering after a
//    lowering (ReleaseOmpPoolsOnNextUse) first releases its own pool, once per lowering:
//    omp_pause_resource_all (OpenMP 5.0) frees the calling thread's pool in libgomp, and only
//    that; no thread can free another's. A thread that never calls CpuAcc again keeps its pool
//    until it exits; so a compile on a thread without a pool (an admin call, a shape program's
//    build: threads that rarely compute) releases the pool it made when it ends.
//  - When pthread_create fails, libgomp ends the process (gomp_fatal): no error reaches the
//    caller, whose request would have been the one to fail. So before this thread's pool grows,
//    the process's thread headroom (cgroup pids limit, RLIMIT_NPROC) is checked, with workers
//    that other threads are about to create counted as taken, and a team that cannot be created
//    is this request's error (kResourceExhausted), never a thread creation that fails.
//
// Thread-compatible: one per call, on the calling thread's stack.
class OmpTeamScope {
 public:
  // `starts_team`: the work surely starts a team of `threads` (a program with a parallel step);
  // the pool is then known to be that big afterwards. `label` prefixes the error.
  static Result<OmpTeamScope> Enter(int threads, bool starts_team, const std::string& label);
  OmpTeamScope(OmpTeamScope&& other) noexcept
      : reserved_(std::exchange(other.reserved_, 0)),
        release_at_exit_(std::exchange(other.release_at_exit_, false)) {}
  OmpTeamScope& operator=(OmpTeamScope&&) = delete;
  ~OmpTeamScope();

 private:
  OmpTeamScope(int reserved, bool release_at_exit)
      : reserved_(reserved), release_at_exit_(release_at_exit) {}
  int reserved_;          // workers this scope counted as about to be created
  bool release_at_exit_;  // a compile on a thread that had no pool: leave it without one
};

// Every thread releases its OpenMP worker pool before it next runs CpuAcc code (after a thread
// count was lowered).
void ReleaseOmpPoolsOnNextUse();

struct ValueStorage {
  enum class Kind { kInput, kOutput, kConstant, kTemporary };
  Kind kind = Kind::kTemporary;
  std::size_t index = 0;  // boundary index (input/output), or byte offset in the workspace
};

struct ProgramValue {
  dnnl::memory::desc md;
  ValueStorage storage;
  dnnl::memory constant;  // kConstant only: owned, immutable after compilation
};

struct ProgramStep {
  enum class Kind { kPrimitive, kCopy, kFill, kPool };
  Kind kind = Kind::kPrimitive;
  // OpenMP threads this step runs with: the program's count, or 1 for a step too small to gain
  // from a second thread (compiler.cpp, StepThreads). It must be the count the primitive was
  // created with: oneDNN fixes some kernels' team size at creation.
  int threads = 1;
  dnnl::primitive primitive;
  std::vector<std::pair<int, int>> args;  // dnnl argument id -> value index
  dnnl::memory::desc scratchpad;          // empty when the primitive needs none
  // kCopy: bytes from value `copy_from` to value `copy_to` (same dense layout).
  int copy_from = -1, copy_to = -1;
  std::size_t copy_bytes = 0;
  // kFill: every float of value `copy_to` set to `fill_value` (Pad's border).
  float fill_value = 0.0f;
  // kPool: CpuAcc's own pooling (pool_kernel.hpp) from value `copy_from` into `copy_to`.
  PoolGeometry pool;
  PoolFunction pool_function = nullptr;
};

// Immutable after Finish(); Run is thread-safe. Building is single-threaded.
class Program {
 public:
  // `threads`: the most OpenMP threads any step uses (the option intra_op_threads).
  Program(dnnl::engine engine, int threads);
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // ---- building (single-threaded, before Finish) ----
  int AddValue(dnnl::memory::desc md, ValueStorage storage);
  int AddConstant(dnnl::memory memory);
  // A constant other programs share (ConstantCache): this program keeps it alive.
  int AddSharedConstant(std::shared_ptr<const dnnl::memory> memory);
  int AddTemporary(const dnnl::memory::desc& md);
  // `threads`: what the primitive was created with (at most the program's count).
  void AddPrimitive(dnnl::primitive primitive, std::vector<std::pair<int, int>> args,
                    const dnnl::memory::desc& scratchpad, int threads);
  void AddCopy(int from, int to);
  // Sets every element of FP32 value `to` (dense, any dims) to `value`.
  void AddFill(int to, float value);
  // Pools value `from` into value `to` (both channels-last, `geometry` prepared), one thread.
  void AddPool(int from, int to, PoolGeometry geometry);
  // Boundary tensors the host passes (FP32, or UINT8/INT8 around quantized layers), checked on
  // every request.
  void SetBoundary(std::vector<TensorInfo> inputs, std::vector<TensorInfo> outputs);
  void Finish();

  const ProgramValue& value(int index) const { return values_[index]; }
  const dnnl::engine& engine() const { return engine_; }
  std::size_t step_count() const { return steps_.size(); }
  int threads() const { return threads_; }
  // Steps that run with more than one thread (tests check the two-thread policy with it).
  std::size_t parallel_step_count() const;

  // Runs every step on the host's tensors; `label` prefixes error messages. Boundary input i is
  // inputs[(*input_map)[i]] (input_map null: inputs[i]).
  Status Run(std::span<const ConstTensorView> inputs, const std::vector<std::size_t>* input_map,
             std::span<const TensorView> outputs, const std::string& label) const;

 private:
  struct Context;
  std::unique_ptr<Context> NewContext() const;
  std::unique_ptr<Context> Acquire() const;
  void Release(std::unique_ptr<Context> context) const;

  dnnl::engine engine_;
  const int threads_;
  int team_threads_ = 1;  // the largest step's threads: the team Run starts (1: none)
  std::vector<ProgramValue> values_;
  std::vector<std::shared_ptr<const dnnl::memory>> shared_constants_;  // see AddSharedConstant
  std::vector<ProgramStep> steps_;
  std::vector<TensorInfo> inputs_, outputs_;
  std::size_t workspace_bytes_ = 0;   // temporaries
  std::size_t scratchpad_bytes_ = 0;  // the largest scratchpad of any step (steps run in turn)
  // Values bound to the host's buffers per request: (value index, boundary input?, boundary index)
  struct Binding {
    int value;
    bool input;
    std::size_t index;
  };
  std::vector<Binding> bindings_;

  mutable std::mutex pool_mutex_;
  mutable std::vector<std::unique_ptr<Context>> pool_;  // guarded by pool_mutex_
};

}  // namespace backplane::cpu_acc
