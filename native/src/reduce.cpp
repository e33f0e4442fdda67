#include "mlxj/reduce.h"

#include <cmath>
#include <complex>
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

// Every kernel computes d[i] = x[i] op y[i]; d may alias x or y (same index only).
template <typename T>
void reduce_native(T* d, const T* x, const T* y, size_t n, ReduceOp op) {
  using U = typename Arith<T>::type;
  switch (op) {
    case ReduceOp::Sum:  // unsigned arithmetic: wraps like numpy, no UB on overflow
      for (size_t i = 0; i < n; ++i) d[i] = T(U(x[i]) + U(y[i]));
      break;
    case ReduceOp::Max:
      for (size_t i = 0; i < n; ++i) d[i] = max_nan(x[i], y[i]);
      break;
    case ReduceOp::Min:
      for (size_t i = 0; i < n; ++i) d[i] = min_nan(x[i], y[i]);
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
void reduce_16(uint16_t* d, const uint16_t* x, const uint16_t* y, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    float a = ToF(x[i]), b = ToF(y[i]);
    if (op == ReduceOp::Sum) {
      d[i] = FromF(a + b);
    } else {  // keep the winner's original bits (same choice as max_nan/min_nan)
      bool keep_a = a != a || (op == ReduceOp::Max ? a > b : a < b);
      d[i] = keep_a ? x[i] : y[i];
    }
  }
}

void reduce_complex(std::complex<float>* d, const std::complex<float>* x, const std::complex<float>* y, size_t n,
                    ReduceOp op) {
  if (op == ReduceOp::Sum) {
    for (size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const auto a = x[i], b = y[i];
    bool a_less = a.real() < b.real() || (a.real() == b.real() && a.imag() < b.imag());
    bool b_less = b.real() < a.real() || (a.real() == b.real() && b.imag() < a.imag());
    d[i] = (op == ReduceOp::Max ? a_less : b_less) ? b : a;
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

template <typename T>
void typed(void* d, const void* x, const void* y, size_t n, ReduceOp op) {
  reduce_native(static_cast<T*>(d), static_cast<const T*>(x), static_cast<const T*>(y), n, op);
}

void reduce_to(void* d, const void* x, const void* y, size_t n, Dtype t, ReduceOp op) {
  switch (t) {
    case Dtype::Bool:
      return reduce_bool(static_cast<uint8_t*>(d), static_cast<const uint8_t*>(x), static_cast<const uint8_t*>(y), n, op);
    case Dtype::Int8: return typed<int8_t>(d, x, y, n, op);
    case Dtype::Int16: return typed<int16_t>(d, x, y, n, op);
    case Dtype::Int32: return typed<int32_t>(d, x, y, n, op);
    case Dtype::Int64: return typed<int64_t>(d, x, y, n, op);
    case Dtype::UInt8: return typed<uint8_t>(d, x, y, n, op);
    case Dtype::UInt16: return typed<uint16_t>(d, x, y, n, op);
    case Dtype::UInt32: return typed<uint32_t>(d, x, y, n, op);
    case Dtype::UInt64: return typed<uint64_t>(d, x, y, n, op);
    case Dtype::Float16:
      return reduce_16<half_to_float, float_to_half>(static_cast<uint16_t*>(d), static_cast<const uint16_t*>(x),
                                                     static_cast<const uint16_t*>(y), n, op);
    case Dtype::BFloat16:
      return reduce_16<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(d), static_cast<const uint16_t*>(x),
                                                     static_cast<const uint16_t*>(y), n, op);
    case Dtype::Float32: return typed<float>(d, x, y, n, op);
    case Dtype::Float64: return typed<double>(d, x, y, n, op);
    case Dtype::Complex64:
      return reduce_complex(static_cast<std::complex<float>*>(d), static_cast<const std::complex<float>*>(x),
                            static_cast<const std::complex<float>*>(y), n, op);
  }
}

void reduce_into(void* dst, const void* src, size_t n, Dtype t, ReduceOp op) { reduce_to(dst, dst, src, n, t, op); }

}  // namespace mlxj
