#include "mlxj/dtype.h"

#include <cstring>
#include <stdexcept>

namespace mlxj {

namespace {
// DLPack type codes (dlpack.h's DLDataTypeCode; a stable ABI).
enum : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kComplex = 5, kBool = 6 };

struct Info {
  Dtype type;
  const char* name;
  size_t size;
  uint8_t dlpack;      // DLPack type code
  const char* format;  // struct format, nullptr when there is none
};
// Indexed by Dtype.
constexpr Info kInfo[] = {
    {Dtype::Bool, "bool", 1, kBool, "?"},
    {Dtype::Int8, "int8", 1, kInt, "b"},
    {Dtype::Int16, "int16", 2, kInt, "h"},
    {Dtype::Int32, "int32", 4, kInt, "i"},
    {Dtype::Int64, "int64", 8, kInt, "q"},
    {Dtype::UInt8, "uint8", 1, kUInt, "B"},
    {Dtype::UInt16, "uint16", 2, kUInt, "H"},
    {Dtype::UInt32, "uint32", 4, kUInt, "I"},
    {Dtype::UInt64, "uint64", 8, kUInt, "Q"},
    {Dtype::Float16, "float16", 2, kFloat, "e"},
    {Dtype::BFloat16, "bfloat16", 2, kBfloat, nullptr},
    {Dtype::Float32, "float32", 4, kFloat, "f"},
    {Dtype::Float64, "float64", 8, kFloat, "d"},
    {Dtype::Complex64, "complex64", 8, kComplex, "Zf"},
};

// The DLPack code of a one-letter struct format, by letter; 0xff: not a type we take.
// Size-dependent letters (l, L; also q/Q/i/I, whose size is the platform's) resolve by itemsize.
uint8_t format_code(char c) {
  switch (c) {
    case '?': return kBool;
    case 'b': case 'h': case 'i': case 'l': case 'q': return kInt;
    case 'B': case 'H': case 'I': case 'L': case 'Q': return kUInt;
    case 'e': case 'f': case 'd': return kFloat;
    default: return 0xff;
  }
}
}  // namespace

size_t dtype_size(Dtype t) { return kInfo[static_cast<int>(t)].size; }
const char* dtype_name(Dtype t) { return kInfo[static_cast<int>(t)].name; }
uint8_t dtype_dlpack_code(Dtype t) { return kInfo[static_cast<int>(t)].dlpack; }
const char* dtype_format(Dtype t) { return kInfo[static_cast<int>(t)].format; }

std::vector<const char*> dtype_list() {
  std::vector<const char*> names;
  for (const auto& i : kInfo) names.push_back(i.name);
  return names;
}

std::string dtype_names() {
  std::string all;
  for (const char* name : dtype_list()) all += std::string(all.empty() ? "" : ", ") + name;
  return all;
}

Dtype dtype_from_name(const std::string& name) {
  for (const auto& i : kInfo)
    if (name == i.name) return i.type;
  throw std::invalid_argument("unsupported dtype '" + name + "': supported are " + dtype_names());
}

bool dtype_from_dlpack(uint8_t code, size_t bits, Dtype* t) {
  for (const auto& i : kInfo)
    if (i.dlpack == code && i.size * 8 == bits) {
      *t = i.type;
      return true;
    }
  return false;
}

bool dtype_from_format(const char* f, size_t itemsize, Dtype* t) {
  if (!f) f = "B";
  if (*f == '<' || *f == '=' || *f == '@' || *f == '|') ++f;
  if (std::strcmp(f, "Zf") == 0) {
    *t = Dtype::Complex64;
    return itemsize == 8;
  }
  if (!f[0] || f[1]) return false;
  return dtype_from_dlpack(format_code(f[0]), itemsize * 8, t);
}

}  // namespace mlxj
