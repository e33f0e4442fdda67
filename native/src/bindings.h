// Shared by the bindings_*.cpp files (the only code that knows Python): array
// checks, the dtype of a DLPack array, and call options that honour Ctrl-C.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <stdexcept>
#include <string>

#include "mlxj/dtype.h"
#include "mlxj/group.h"

namespace mlxj::py {

namespace nb = nanobind;

using AnyArray = nb::ndarray<nb::device::cpu>;
using InArray = nb::ndarray<nb::ro, nb::device::cpu>;

// The core's dtype of a DLPack array, from the one dtype table; throws std::invalid_argument.
template <typename A>
Dtype dtype_of(const A& a) {
  auto d = a.dtype();
  Dtype t;
  if (d.lanes == 1 && dtype_from_dlpack(d.code, d.bits, &t)) return t;
  if (d.lanes != 1) throw std::invalid_argument("vector dtypes are not supported");
  throw std::invalid_argument("unsupported dtype (DLPack code " + std::to_string(d.code) + ", " +
                              std::to_string(d.bits) + " bits): supported are " + dtype_names());
}

template <typename A>
void require_contiguous(const A& a, const char* what) {
  if (a.size() == 0) return;
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect)
      throw std::invalid_argument(std::string(what) + " must be C-contiguous");
    expect *= int64_t(a.shape(i));
  }
}

// Releases the GIL around a blocking core call (instead of nb::gil_scoped_release): a thread
// that returns while the interpreter exits parks instead of taking it back (bindings_exit.cpp).
class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

// Whether this is Python's main thread (the only one that runs signal handlers); no GIL needed.
bool on_main_thread();

// Options for a blocking core call: `timeout` seconds (-1 = wait), interrupted by Ctrl-C.
CallOptions call(double timeout);

void bind_errors(nb::module_& m);
void bind_group(nb::module_& m);
void bind_buffer(nb::module_& m);
void bind_exit(nb::module_& m);

}  // namespace mlxj::py
