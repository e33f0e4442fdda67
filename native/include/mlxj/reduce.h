// Element-wise reductions: dst[i] = op(dst[i], src[i]).
#pragma once
#include <cstddef>

#include "mlxj/dtype.h"

namespace mlxj {

enum class ReduceOp : uint8_t { Sum, Max, Min };

const char* reduce_name(ReduceOp op);
// Integers wrap (exact modular sums, as numpy); bool sums are logical or;
// complex max/min compare (real, imag) lexicographically, as numpy does.
void reduce_into(void* dst, const void* src, size_t count, Dtype type, ReduceOp op);
// dst[i] = x[i] op y[i]; dst may be x or y.
void reduce_to(void* dst, const void* x, const void* y, size_t count, Dtype type, ReduceOp op);

}  // namespace mlxj
