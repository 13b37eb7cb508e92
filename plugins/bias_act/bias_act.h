// BiasAct on the host: its attributes (read once, for both runtimes' adapters) and the fp32 CPU
// kernel of the CPU execution provider.
#pragma once
#include <cstdint>

#include "common/activation.h"
#include "common/attrs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct BiasActAttrs {
  using Spec = spec::BiasAct;
  Act act;
  explicit BiasActAttrs(const AttrValues& a) : act(act_named(a.text(Spec::kActivation))) {}
};

// x, y: [total / cols, cols]; bias: [cols].
void bias_act_cpu(const float* x, const float* bias, float* y, int64_t total, int64_t cols, Act act);

}  // namespace deployfuse
