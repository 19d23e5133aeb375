#include "constant_cache.hpp"

#include <algorithm>

namespace backplane::cpu_acc {

std::shared_ptr<const dnnl::memory> ConstantCache::FindLocked(const ConstantOrigin& origin,
                                                              const dnnl::memory::desc& plain,
                                                              const dnnl::memory::desc& wanted) {
  std::erase_if(entries_, [](const Entry& entry) { return entry.memory.expired(); });
  for (const Entry& entry : entries_) {
    if (entry.origin != origin || entry.plain != plain || entry.wanted != wanted)
      continue;
    // Null when the last holder let go since the sweep above: then it is made anew.
    return entry.memory.lock();
  }
  return nullptr;
}

std::shared_ptr<const dnnl::memory> ConstantCache::Get(const ConstantOrigin& origin,
                                                       const dnnl::memory::desc& plain,
                                                       const dnnl::memory::desc& wanted,
                                                       const std::function<dnnl::memory()>& make) {
  {
    std::lock_guard lock(mutex_);
    if (auto found = FindLocked(origin, plain, wanted))
      return found;
  }
  // Laying out 21 MB of weights takes milliseconds: not under the lock other compiles need.
  auto made = std::make_shared<const dnnl::memory>(make());
  std::lock_guard lock(mutex_);
  if (auto found = FindLocked(origin, plain, wanted))
    return found;
  entries_.push_back({origin, plain, wanted, made});
  return made;
}

}  // namespace backplane::cpu_acc
