// Element types the core moves and reduces.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mlxj {

enum class Dtype : uint8_t {
  Bool, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64,
  Float16, BFloat16, Float32, Float64, Complex64,
};

size_t dtype_size(Dtype t);
const char* dtype_name(Dtype t);
// Parses a name such as "float32" or "bfloat16"; throws std::invalid_argument.
Dtype dtype_from_name(const std::string& name);

}  // namespace mlxj
