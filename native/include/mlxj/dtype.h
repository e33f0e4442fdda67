// Element types the core moves and reduces, and the one table that maps them to
// names, DLPack codes and buffer-protocol formats.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mlxj {

enum class Dtype : uint8_t {
  Bool, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64,
  Float16, BFloat16, Float32, Float64, Complex64,
};

size_t dtype_size(Dtype t);
const char* dtype_name(Dtype t);
// Parses a name such as "float32" or "bfloat16"; throws std::invalid_argument.
Dtype dtype_from_name(const std::string& name);
// Every supported dtype's name, in the table's order.
std::vector<const char*> dtype_list();
// "bool, int8, ..." for messages.
std::string dtype_names();

// DLPack's type code (kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6).
uint8_t dtype_dlpack_code(Dtype t);
// The dtype of a DLPack (code, bits); false when the core has none.
bool dtype_from_dlpack(uint8_t code, size_t bits, Dtype* t);
// The buffer-protocol (struct) format, e.g. "f"; nullptr for bfloat16, which has none.
const char* dtype_format(Dtype t);
// The dtype of a struct format ("f", "<i", "Zf", ...; null = "B") with items of `itemsize`
// bytes; false when unsupported or when the size does not match.
bool dtype_from_format(const char* format, size_t itemsize, Dtype* t);

}  // namespace mlxj
