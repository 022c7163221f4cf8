// A Linear epilogue as oneDNN matmul post-ops, for the CPU Linears (linear.cc, bf16_weight_linear.cc).
#pragma once

#include "kernels/linear.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace iris::kernels::cpu {

inline dnnl::primitive_attr MatmulEpilogueAttr(Epilogue epilogue) {
  dnnl::post_ops ops;
  switch (epilogue) {
    case Epilogue::kNone: break;
    case Epilogue::kGeluErf: ops.append_eltwise(1.f, dnnl::algorithm::eltwise_gelu_erf, 0.f, 0.f); break;
    case Epilogue::kAccumulate: ops.append_sum(1.f); break;
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  return attr;
}

}  // namespace iris::kernels::cpu
