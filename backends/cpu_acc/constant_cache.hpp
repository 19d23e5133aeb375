// A network's constants in the layouts oneDNN's primitives want them (blocked weights), laid out
// once per backend instance and shared by every program that wants the same bytes in the same
// layout.
//
// Why: each compiled program laid out its own copy. A network compiled at several batch sizes
// (shape programs; a batched model runs at up to seven execution sizes) held the wide MLP
// 784-2048-2048-10's 21 MB of weights once per program, resident memory growing by a copy each.
//
// Trap kept in mind here: entries are keyed by the address of the network's bytes. That is sound
// only because an entry lives exactly as long as some program holds it (the cache keeps weak
// references), no program outlives the network's constants (the SDK's contract on
// OperatorDesc::constant_inputs), and constants never change: while an entry can be found, its
// address still holds the bytes it was made from. A value computed from constants (weights
// scaled by Gemm's alpha or a folded BatchNormalization) is keyed by every constant it reads and a
// recipe that names the computation with each of its parameters: a key that leaves one out hands
// one network's weights to another.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace backplane::cpu_acc {

// What a shared constant is made from: the network's constants at `sources` (each one it reads),
// as they are (`recipe` empty) or computed as `recipe` says, parameters included
// ("x gamma/sqrt(var+eps), eps 0x1.4f8b58p-17"). Value type.
struct ConstantOrigin {
  std::vector<const void*> sources;
  std::string recipe;
  friend bool operator==(const ConstantOrigin&, const ConstantOrigin&) = default;
};

// Thread-safe: programs are compiled concurrently (loads, the runtime's shape-program builder,
// layers met at a new shape on a request's thread).
class ConstantCache {
 public:
  // The constant made from `origin` (laid out as `plain`) in layout `wanted`: the memory made for
  // it earlier while a program still holds it, else `make()`'s, which is kept for the next
  // caller. `make` runs without the cache's lock; two callers racing for one entry may both make
  // it, and the later one takes the first one's.
  std::shared_ptr<const dnnl::memory> Get(const ConstantOrigin& origin,
                                          const dnnl::memory::desc& plain,
                                          const dnnl::memory::desc& wanted,
                                          const std::function<dnnl::memory()>& make);

 private:
  struct Entry {
    ConstantOrigin origin;
    dnnl::memory::desc plain, wanted;
    std::weak_ptr<const dnnl::memory> memory;
  };
  // The live memory of the entry for this key, or null; drops the expired entries it passes.
  std::shared_ptr<const dnnl::memory> FindLocked(const ConstantOrigin& origin,
                                                 const dnnl::memory::desc& plain,
                                                 const dnnl::memory::desc& wanted);

  std::mutex mutex_;
  std::vector<Entry> entries_;  // guarded by mutex_; a few per weight tensor at most
};

}  // namespace backplane::cpu_acc
