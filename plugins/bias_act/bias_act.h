// BiasAct fp32 CPU kernel (the CPU execution provider's).
#pragma once
#include <cstdint>

#include "common/activation.h"

namespace deployfuse {

// x, y: [total / cols, cols]; bias: [cols].
void bias_act_cpu(const float* x, const float* bias, float* y, int64_t total, int64_t cols, Act act);

}  // namespace deployfuse
