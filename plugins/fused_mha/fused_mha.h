// FusedMHA fp32 CPU kernel (the CPU execution provider's).
#pragma once

#include "common/mha_shape.h"

namespace deployfuse {

// mask may be null.
void fused_mha_cpu(const float* q, const float* k, const float* v, const float* mask, float* y, const MhaShape& s);

}  // namespace deployfuse
