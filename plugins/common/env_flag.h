// A benchmark switch read from the environment (callers keep the answer in a static): "1" on, "0" off, anything else
// (or unset) the default. The kernels' defaults are the measured choices; the switches only bring
// back the alternatives for benchmarks to compare.
#pragma once
#include <cstdlib>
#include <cstring>

namespace deployfuse {

inline bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  if (std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  return fallback;
}

}  // namespace deployfuse
