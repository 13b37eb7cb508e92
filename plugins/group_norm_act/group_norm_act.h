// GroupNormAct fp32 CPU kernel (the CPU execution provider's).
#pragma once
#include <cstdint>

#include "common/activation.h"

namespace deployfuse {

// x, y: [n, channels, spatial]; scale, bias: [channels].
void group_norm_act_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t n, int64_t channels, int64_t spatial,
                        int64_t groups, float epsilon, Act act);

}  // namespace deployfuse
