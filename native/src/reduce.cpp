#include "mlxj/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mlxj {

namespace {

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { ++e; man <<= 1; } while ((man & 0x400) == 0);
    bits = sign | uint32_t(112 - e) << 23 | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {  // round to nearest even, as numpy
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = uint16_t((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // overflows to inf after rounding
  if (ax < 0x38800000u) {                        // subnormal or zero in half
    if (ax < 0x33000000u) return sign;
    uint32_t man = (ax & 0x7fffff) | 0x800000;
    int shift = 113 - int(ax >> 23) + 13;
    uint32_t r = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) ++r;
    return sign | uint16_t(r);
  }
  uint32_t r = ((ax >> 13) - (112u << 10)), rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return sign | uint16_t(r);
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

template <typename T>
T max_nan(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T>
T min_nan(T a, T b) { return (a < b || a != a) ? a : b; }

template <typename T, bool = std::is_integral_v<T>>
struct Arith { using type = T; };
template <typename T>
struct Arith<T, true> { using type = std::make_unsigned_t<T>; };

// Elements are loaded and stored through memcpy: data folded straight out of a
// shared-memory ring, or a user's buffer, need not be aligned for T, and a typed
// access there is undefined (vectorised code may even assume the alignment).
// Compilers turn these into plain unaligned loads and stores, at the same speed.
template <typename T>
inline T ld(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
inline void st(uint8_t* p, size_t i, T v) { std::memcpy(p + i * sizeof(T), &v, sizeof(T)); }

// Every kernel computes d[i] = x[i] op y[i]; d may alias x or y (same index only).
template <typename T>
void reduce_native(uint8_t* d, const uint8_t* x, const uint8_t* y, size_t n, ReduceOp op) {
  using U = typename Arith<T>::type;
  switch (op) {
    case ReduceOp::Sum:  // unsigned arithmetic: wraps like numpy, no UB on overflow
      for (size_t i = 0; i < n; ++i) st<T>(d, i, T(U(ld<T>(x, i)) + U(ld<T>(y, i))));
      break;
    case ReduceOp::Max:
      for (size_t i = 0; i < n; ++i) st<T>(d, i, max_nan(ld<T>(x, i), ld<T>(y, i)));
      break;
    case ReduceOp::Min:
      for (size_t i = 0; i < n; ++i) st<T>(d, i, min_nan(ld<T>(x, i), ld<T>(y, i)));
      break;
  }
}

void reduce_bool(uint8_t* d, const uint8_t* x, const uint8_t* y, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    bool a = x[i] != 0, b = y[i] != 0;
    d[i] = op == ReduceOp::Min ? (a && b) : (a || b);
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void reduce_16(uint8_t* d, const uint8_t* x, const uint8_t* y, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t xb = ld<uint16_t>(x, i), yb = ld<uint16_t>(y, i);
    float a = ToF(xb), b = ToF(yb);
    if (op == ReduceOp::Sum) {
      st<uint16_t>(d, i, FromF(a + b));
    } else {  // keep the winner's original bits (same choice as max_nan/min_nan)
      bool keep_a = a != a || (op == ReduceOp::Max ? a > b : a < b);
      st<uint16_t>(d, i, keep_a ? xb : yb);
    }
  }
}

// Complex sums are float sums of (real, imag) pairs; max/min compare pairs lexicographically.
void reduce_complex(uint8_t* d, const uint8_t* x, const uint8_t* y, size_t n, ReduceOp op) {
  if (op == ReduceOp::Sum) return reduce_native<float>(d, x, y, 2 * n, op);
  for (size_t i = 0; i < n; ++i) {
    float ar = ld<float>(x, 2 * i), ai = ld<float>(x, 2 * i + 1), br = ld<float>(y, 2 * i), bi = ld<float>(y, 2 * i + 1);
    bool a_less = ar < br || (ar == br && ai < bi);
    bool b_less = br < ar || (ar == br && bi < ai);
    bool a_nan = ar != ar || ai != ai, b_nan = br != br || bi != bi;
    // NaN wins wherever it is (as for real max/min): the first operand's when both are NaN.
    bool take_b = a_nan ? false : b_nan ? true : op == ReduceOp::Max ? a_less : b_less;
    st<float>(d, 2 * i, take_b ? br : ar);
    st<float>(d, 2 * i + 1, take_b ? bi : ai);
  }
}

}  // namespace

const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

void reduce_to(void* dst, const void* xv, const void* yv, size_t n, Dtype t, ReduceOp op) {
  auto* d = static_cast<uint8_t*>(dst);
  auto* x = static_cast<const uint8_t*>(xv);
  auto* y = static_cast<const uint8_t*>(yv);
  switch (t) {
    case Dtype::Bool: return reduce_bool(d, x, y, n, op);
    case Dtype::Int8: return reduce_native<int8_t>(d, x, y, n, op);
    case Dtype::Int16: return reduce_native<int16_t>(d, x, y, n, op);
    case Dtype::Int32: return reduce_native<int32_t>(d, x, y, n, op);
    case Dtype::Int64: return reduce_native<int64_t>(d, x, y, n, op);
    case Dtype::UInt8: return reduce_native<uint8_t>(d, x, y, n, op);
    case Dtype::UInt16: return reduce_native<uint16_t>(d, x, y, n, op);
    case Dtype::UInt32: return reduce_native<uint32_t>(d, x, y, n, op);
    case Dtype::UInt64: return reduce_native<uint64_t>(d, x, y, n, op);
    case Dtype::Float16: return reduce_16<half_to_float, float_to_half>(d, x, y, n, op);
    case Dtype::BFloat16: return reduce_16<bf16_to_float, float_to_bf16>(d, x, y, n, op);
    case Dtype::Float32: return reduce_native<float>(d, x, y, n, op);
    case Dtype::Float64: return reduce_native<double>(d, x, y, n, op);
    case Dtype::Complex64: return reduce_complex(d, x, y, n, op);
  }
}

void reduce_into(void* dst, const void* src, size_t n, Dtype t, ReduceOp op) { reduce_to(dst, dst, src, n, t, op); }

}  // namespace mlxj
