// GemmAct on the host: its attributes (read once, for both runtimes' adapters) and the fp32 CPU
// kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/activation.h"
#include "common/attrs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct GemmActAttrs {
  using Spec = spec::GemmAct;
  Act act;
  int algo;
  explicit GemmActAttrs(const AttrValues& a) : act(act_named(a.text(Spec::kActivation))), algo(static_cast<int>(a.integer(Spec::kAlgo))) {
    if (algo < -1) throw std::invalid_argument("algo must be -1 (the heuristic's choice) or a candidate index >= 0");
  }
};

// y[m, n] = act(x[m, k] @ w[k, n] + bias[n] (+ residual[m, n])); residual may be null.
void gemm_act_cpu(const float* x, const float* w, const float* bias, const float* residual, float* y, int64_t m, int64_t n, int64_t k,
                  Act act);

}  // namespace deployfuse
