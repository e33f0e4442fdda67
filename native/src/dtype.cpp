#include "mlxj/dtype.h"

#include <stdexcept>

namespace mlxj {

namespace {
struct Info {
  Dtype type;
  const char* name;
  size_t size;
};
constexpr Info kInfo[] = {
    {Dtype::Bool, "bool", 1},         {Dtype::Int8, "int8", 1},
    {Dtype::Int16, "int16", 2},       {Dtype::Int32, "int32", 4},
    {Dtype::Int64, "int64", 8},       {Dtype::UInt8, "uint8", 1},
    {Dtype::UInt16, "uint16", 2},     {Dtype::UInt32, "uint32", 4},
    {Dtype::UInt64, "uint64", 8},     {Dtype::Float16, "float16", 2},
    {Dtype::BFloat16, "bfloat16", 2}, {Dtype::Float32, "float32", 4},
    {Dtype::Float64, "float64", 8},   {Dtype::Complex64, "complex64", 8},
};
}  // namespace

size_t dtype_size(Dtype t) { return kInfo[static_cast<int>(t)].size; }
const char* dtype_name(Dtype t) { return kInfo[static_cast<int>(t)].name; }

Dtype dtype_from_name(const std::string& name) {
  for (const auto& i : kInfo)
    if (name == i.name) return i.type;
  std::string all;
  for (const auto& i : kInfo) all += std::string(all.empty() ? "" : ", ") + i.name;
  throw std::invalid_argument("unsupported dtype '" + name + "': supported are " + all);
}

}  // namespace mlxj
