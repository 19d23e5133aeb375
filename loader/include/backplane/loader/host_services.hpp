// The host side of SDK 1.2's IHost: parallel work for backends, run by TBB templates compiled
// into the host (docs/loading-rules.md rule 5).
#pragma once

#include "backplane/sdk/backend.hpp"

namespace backplane::loader {

// The process's IHost, given to every backend instance built against API >= 1.2
// (BackendInstance calls IBackend::SetHost). Created on first use and never destroyed, so that it
// outlives every instance, also those destroyed during static destruction. Thread-safe.
IHost& HostServices();

}  // namespace backplane::loader
