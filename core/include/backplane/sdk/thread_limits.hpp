// What the machine lets a backend's threads be: how many CPUs the calling thread may run on
// (sched_getaffinity, and the cgroup CPU quota of the process's cgroup), and how many more threads
// the process may create (the cgroup's pids limit, RLIMIT_NPROC).
//
// Header-only on purpose: a backend links no Backplane library, and it must bound its thread
// options also on a host older than this header (an IHost service would exist only on new hosts,
// so a backend would need this code anyway as its fallback). The host's runtime calls the same
// functions, so that host and backend refuse a thread count by the same number and the same words.
//
// Linux only. Each call reads a few small files of /proc and /sys: call it when an option is set
// or before a thread pool grows, never on every request.
//
// A thread-count option is an int64 option named `threads` or `<something>_threads`
// (IsThreadCountOption). The host refuses a value outside 1 to UsableCpus().count for such an
// option before the backend sees it; a backend checks it again with CheckThreadCount, because
// an older host does not.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/options.hpp"
#include "backplane/core/status.hpp"

namespace backplane {

// How many CPUs threads of this process may use at once, and why.
struct UsableCpus {
  int count = 1;        // the least of the bounds below, at least 1
  int by_affinity = 1;  // CPUs in the calling thread's affinity mask
  int by_quota = 0;     // the cgroup CPU quota rounded up (quota/period); 0: no quota
  std::string quota;    // where by_quota comes from: "cpu.max 150000/100000 of /sys/fs/cgroup/a"

  // "2 by affinity, no cgroup quota" / "4 by affinity, 2 by the cgroup quota (cpu.max ...)"
  std::string Describe() const {
    std::string text = std::to_string(by_affinity) + " by affinity, ";
    if (by_quota == 0)
      return text + "no cgroup quota";
    return text + std::to_string(by_quota) + " by the cgroup quota (" + quota + ")";
  }
};

// How many more threads the process may create, and what limits it.
struct ThreadHeadroom {
  static constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();
  int64_t more = kUnlimited;
  std::string
      limited_by;  // "pids.max 1500 - pids.current 1498 of /sys/fs/cgroup/pids/x"; "" unlimited
};

namespace thread_limits_detail {

inline std::optional<std::string> ReadSmallFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in)
    return std::nullopt;
  std::string text;
  std::getline(in, text, '\0');
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  return text;
}

inline std::optional<int64_t> ParseInt(std::string_view text) {
  if (text.empty())
    return std::nullopt;
  int64_t value = 0;
  bool negative = false;
  std::size_t i = 0;
  if (text[0] == '-') {
    negative = true;
    i = 1;
  }
  if (i == text.size())
    return std::nullopt;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9' || value > (std::numeric_limits<int64_t>::max() - 9) / 10)
      return std::nullopt;
    value = value * 10 + (text[i] - '0');
  }
  return negative ? -value : value;
}

// One cgroup hierarchy mounted in this process's mount namespace.
struct CgroupMount {
  bool v2 = false;
  std::vector<std::string> controllers;  // v1: cpu, pids, ... (from the super options)
  std::string root;                      // the hierarchy's directory mounted there
  std::filesystem::path mount_point;
};

inline std::vector<CgroupMount> ParseMountInfo(const std::string& mountinfo) {
  std::vector<CgroupMount> mounts;
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    // "36 35 98:0 /root /mount/point rw,... [optional fields] - fstype source super,options"
    const std::size_t dash = line.find(" - ");
    if (dash == std::string::npos)
      continue;
    std::istringstream left(line.substr(0, dash)), right(line.substr(dash + 3));
    std::string id, parent, device, root, mount_point, fstype, source, super_options;
    if (!(left >> id >> parent >> device >> root >> mount_point) || !(right >> fstype >> source))
      continue;
    right >> super_options;
    if (fstype != "cgroup" && fstype != "cgroup2")
      continue;
    CgroupMount mount{fstype == "cgroup2", {}, root, mount_point};
    std::istringstream options(super_options);
    for (std::string option; std::getline(options, option, ',');)
      mount.controllers.push_back(option);
    mounts.push_back(std::move(mount));
  }
  return mounts;
}

// The directories of this process's cgroup for `controller` ("cpu", "pids"), from its own up to
// the mount point: v1's hierarchy with that controller, and the v2 hierarchy (whose files exist
// only where the controller is enabled). A limit of any ancestor holds for the process too.
inline std::vector<std::filesystem::path> CgroupDirs(const std::string& proc_self_cgroup,
                                                     const std::vector<CgroupMount>& mounts,
                                                     std::string_view controller) {
  std::vector<std::filesystem::path> dirs;
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-id:controller,list:/path"; v2 is "0::/path".
    const std::size_t first = line.find(':');
    const std::size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos)
      continue;
    const std::string list = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    bool has_controller = false;
    std::istringstream names(list);
    for (std::string name; std::getline(names, name, ',');)
      has_controller = has_controller || name == controller;
    const bool v2 = list.empty();
    if (!v2 && !has_controller)
      continue;
    for (const CgroupMount& mount : mounts) {
      if (mount.v2 != v2)
        continue;
      if (!v2 && std::find(mount.controllers.begin(), mount.controllers.end(), controller) ==
                     mount.controllers.end()) {
        continue;
      }
      // The mount shows the hierarchy from `root` down (a container's bind mount of its own
      // cgroup); a cgroup outside it is not visible here.
      std::string relative;
      if (mount.root == "/")
        relative = path;
      else if (path.compare(0, mount.root.size(), mount.root) == 0)
        relative = path.substr(mount.root.size());
      else
        continue;
      std::filesystem::path dir = mount.mount_point;
      std::vector<std::filesystem::path> chain{dir};
      std::istringstream parts(relative);
      for (std::string part; std::getline(parts, part, '/');) {
        if (part.empty())
          continue;
        dir /= part;
        chain.push_back(dir);
      }
      dirs.insert(dirs.end(), chain.rbegin(), chain.rend());  // own directory first
      break;
    }
  }
  return dirs;
}

inline std::vector<std::filesystem::path> OwnCgroupDirs(std::string_view controller) {
  const auto cgroup = ReadSmallFile("/proc/self/cgroup");
  const auto mountinfo = ReadSmallFile("/proc/self/mountinfo");
  if (!cgroup || !mountinfo)
    return {};
  return CgroupDirs(*cgroup, ParseMountInfo(*mountinfo), controller);
}

// The smallest CPU quota of `dirs` rounded up to whole CPUs (0: none), and where it is set.
inline int QuotaCpus(const std::vector<std::filesystem::path>& dirs, std::string* source) {
  int best = 0;
  auto consider = [&](int64_t quota, int64_t period, const std::string& where) {
    if (quota <= 0 || period <= 0)
      return;
    const int64_t cpus = std::max<int64_t>(1, (quota + period - 1) / period);
    if (best == 0 || cpus < best) {
      best = static_cast<int>(std::min<int64_t>(cpus, std::numeric_limits<int>::max()));
      *source = where;
    }
  };
  for (const auto& dir : dirs) {
    if (auto max = ReadSmallFile(dir / "cpu.max")) {  // v2: "max 100000" or "150000 100000"
      const std::size_t space = max->find(' ');
      if (space != std::string::npos) {
        const auto quota = ParseInt(std::string_view(*max).substr(0, space));
        const auto period = ParseInt(std::string_view(*max).substr(space + 1));
        if (quota && period) {
          consider(*quota, *period,
                   "cpu.max " + std::to_string(*quota) + "/" + std::to_string(*period) + " of " +
                       dir.string());
        }
      }
    }
    const auto quota = ReadSmallFile(dir / "cpu.cfs_quota_us");  // v1: -1 when none
    const auto period = ReadSmallFile(dir / "cpu.cfs_period_us");
    if (quota && period) {
      const auto q = ParseInt(*quota), p = ParseInt(*period);
      if (q && p) {
        consider(*q, *p,
                 "cpu.cfs_quota_us/cpu.cfs_period_us " + std::to_string(*q) + "/" +
                     std::to_string(*p) + " of " + dir.string());
      }
    }
  }
  return best;
}

// The least `pids.max - pids.current` of `dirs` (v1 and v2 name the files alike).
inline ThreadHeadroom PidsHeadroom(const std::vector<std::filesystem::path>& dirs) {
  ThreadHeadroom headroom;
  for (const auto& dir : dirs) {
    const auto max = ReadSmallFile(dir / "pids.max");
    const auto current = ReadSmallFile(dir / "pids.current");
    if (!max || !current || *max == "max")
      continue;
    const auto limit = ParseInt(*max), used = ParseInt(*current);
    if (!limit || !used)
      continue;
    const int64_t more = std::max<int64_t>(0, *limit - *used);
    if (more < headroom.more) {
      headroom.more = more;
      headroom.limited_by =
          "pids.max " + *max + " - pids.current " + *current + " of " + dir.string();
    }
  }
  return headroom;
}

// Threads of the real user id of this process, as RLIMIT_NPROC counts them (those visible in this
// process's /proc). Reads every process's status: only when that limit applies.
inline int64_t ThreadsOfRealUser() {
  const uid_t uid = getuid();
  int64_t threads = 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr)
    return 0;
  while (const dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9')
      continue;
    const auto status = ReadSmallFile(std::filesystem::path("/proc") / entry->d_name / "status");
    if (!status)
      continue;
    std::istringstream lines(*status);
    bool same_user = false;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("Uid:", 0) == 0) {
        std::istringstream fields(line.substr(4));
        int64_t real = -1;
        fields >> real;
        same_user = real == static_cast<int64_t>(uid);
      } else if (same_user && line.rfind("Threads:", 0) == 0) {
        std::istringstream fields(line.substr(8));
        int64_t count = 0;
        if (fields >> count)
          threads += count;
      }
    }
  }
  closedir(proc);
  return threads;
}

}  // namespace thread_limits_detail

// The CPUs threads of this process may use: the calling thread's affinity mask (a process's
// threads share it unless one was changed; a cpuset cgroup shows here too) and the CPU quota of
// the process's cgroup and its ancestors (cgroup v2 cpu.max, v1 cpu.cfs_quota_us).
inline UsableCpus FindUsableCpus() {
  UsableCpus cpus;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    cpus.by_affinity = std::max(1, CPU_COUNT(&mask));
  else
    cpus.by_affinity = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  cpus.by_quota =
      thread_limits_detail::QuotaCpus(thread_limits_detail::OwnCgroupDirs("cpu"), &cpus.quota);
  cpus.count = cpus.by_quota == 0 ? cpus.by_affinity : std::min(cpus.by_affinity, cpus.by_quota);
  return cpus;
}

// How many more threads the process may create: the least headroom of the pids limits of its
// cgroup and their ancestors, and of RLIMIT_NPROC when it applies (not to root). Other processes
// of the cgroup or the user create threads too: the answer is a moment's.
inline ThreadHeadroom FindThreadHeadroom() {
  ThreadHeadroom headroom =
      thread_limits_detail::PidsHeadroom(thread_limits_detail::OwnCgroupDirs("pids"));
  rlimit limit{};
  if (getuid() != 0 && getrlimit(RLIMIT_NPROC, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const int64_t used = thread_limits_detail::ThreadsOfRealUser();
    const int64_t more = std::max<int64_t>(0, static_cast<int64_t>(limit.rlim_cur) - used);
    if (more < headroom.more) {
      headroom.more = more;
      headroom.limited_by = "RLIMIT_NPROC " + std::to_string(limit.rlim_cur) + " - " +
                            std::to_string(used) + " threads of uid " + std::to_string(getuid());
    }
  }
  return headroom;
}

// An int64 option named `threads` or `<something>_threads`: a count of threads, bounded by the
// usable CPUs.
inline bool IsThreadCountOption(const OptionDescriptor& option) {
  const std::string_view name = option.name;
  constexpr std::string_view kSuffix = "_threads";
  return option.type == OptionType::kInt64 &&
         (name == "threads" ||
          (name.size() > kSuffix.size() && name.substr(name.size() - kSuffix.size()) == kSuffix));
}

// OK when `value` is 1 to cpus.count; otherwise kInvalidArgument naming the backend, the option,
// the value, the bound and where the bound comes from.
inline Status CheckThreadCount(std::string_view backend_id, std::string_view option, int64_t value,
                               const UsableCpus& cpus) {
  if (value >= 1 && value <= cpus.count)
    return Status::Ok();
  return InvalidArgument("backend " + std::string(backend_id) + " option '" + std::string(option) +
                         "' must be 1 to " + std::to_string(cpus.count) +
                         " (the CPUs this process may use: " + cpus.Describe() + "), got " +
                         std::to_string(value));
}

// Every thread-count option among `changes` (by `descriptors`) checked against the usable CPUs;
// values of another type are left to the backend's type check.
inline Status CheckThreadCounts(const BackendOptions& changes,
                                const std::vector<OptionDescriptor>& descriptors,
                                std::string_view backend_id) {
  std::optional<UsableCpus> cpus;  // read once, only when a thread count is among the changes
  for (const auto& descriptor : descriptors) {
    if (!IsThreadCountOption(descriptor))
      continue;
    const auto it = changes.find(descriptor.name);
    if (it == changes.end() || TypeOf(it->second) != OptionType::kInt64)
      continue;
    if (!cpus)
      cpus = FindUsableCpus();
    BACKPLANE_RETURN_IF_ERROR(
        CheckThreadCount(backend_id, descriptor.name, std::get<int64_t>(it->second), *cpus));
  }
  return Status::Ok();
}

}  // namespace backplane
