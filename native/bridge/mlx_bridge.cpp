// mlx_jupyter._mlx_bridge: real mlx.core.array objects over user memory, built with
// MLX's own array(void*, Shape, Dtype, deleter) constructor (no copy where MLX's
// allocator can adopt the memory, e.g. Metal; one copy and an immediate deleter call
// otherwise). Linked against the installed MLX; arrays cross into Python through
// nanobind's shared type registry, so they are mlx.core's own array type.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mlx/array.h>
#include <mlx/version.h>

#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;
namespace mx = mlx::core;
using namespace nb::literals;

namespace {

mx::Dtype dtype_from_name(const std::string& name) {
  static const std::pair<const char*, mx::Dtype> kTable[] = {
      {"bool", mx::bool_},       {"int8", mx::int8},         {"int16", mx::int16},
      {"int32", mx::int32},      {"int64", mx::int64},       {"uint8", mx::uint8},
      {"uint16", mx::uint16},    {"uint32", mx::uint32},     {"uint64", mx::uint64},
      {"float16", mx::float16},  {"bfloat16", mx::bfloat16}, {"float32", mx::float32},
      {"float64", mx::float64},  {"complex64", mx::complex64},
  };
  std::string all;
  for (const auto& [n, t] : kTable) {
    if (name == n) return t;
    all += std::string(all.empty() ? "" : ", ") + n;
  }
  throw std::invalid_argument("unsupported dtype '" + name + "': supported are " + all);
}

// Calls a Python callable exactly once, with the GIL, from whichever thread MLX frees on.
// Shared so that the std::function copies MLX may make all refer to one flag.
struct OnceCall {
  nb::object fn, arg;
  bool done = false;
  void operator()() {
    if (done || !Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    if (done) return;
    done = true;
    try {
      if (!fn.is_none()) fn(arg);
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("mlx_jupyter array deleter");
    }
    fn.reset();
    arg.reset();
  }
  ~OnceCall() {
    if (Py_IsInitialized() && (fn.is_valid() || arg.is_valid())) {
      nb::gil_scoped_acquire gil;
      fn.reset();
      arg.reset();
    }
  }
};

mx::Shape shape_from(nb::handle shape) {
  std::vector<int64_t> dims;
  if (!nb::try_cast(shape, dims))
    throw std::invalid_argument("shape must be a sequence of ints, got " +
                                std::string(nb::str(nb::repr(shape)).c_str()));
  mx::Shape out;
  for (int64_t d : dims) {
    if (d < 0 || d > INT32_MAX)
      throw std::invalid_argument("shape entries must be in 0..2**31-1 (MLX dimensions are int32), got " +
                                  std::to_string(d));
    out.push_back(static_cast<int32_t>(d));
  }
  return out;
}

// mlx.core.array, the nanobind type MLX registered (same nanobind ABI and domain "mlx",
// so this module shares MLX's nanobind internals).
nb::handle mlx_array_type() {
  static nb::handle type = nb::object(nb::module_::import_("mlx.core").attr("array")).release();
  return type;
}

// Wraps `data` with MLX's constructor; `once` runs when MLX is done with the memory.
// The C++ array is moved into a fresh instance of MLX's own Python type, found by the
// type object rather than by std::type_info, so no RTTI has to match across libraries.
nb::object make_array(void* data, mx::Shape shape, mx::Dtype t, std::shared_ptr<OnceCall> once) {
  mx::array a(data, std::move(shape), t, [once](void*) { (*once)(); });
  nb::handle type = mlx_array_type();
  if (!nb::type_check(type) || nb::type_size(type) != sizeof(mx::array))
    throw std::runtime_error("mlx.core.array is not the nanobind type this module was built against: "
                             "reinstall mlx-jupyter against the installed MLX");
  nb::object obj = nb::inst_alloc(type);
  new (nb::inst_ptr<mx::array>(obj)) mx::array(std::move(a));
  nb::inst_mark_ready(obj);
  return obj;
}

nb::object array_from_pointer(nb::object address, nb::object shape, nb::object dtype, nb::object deleter) {
  if (!deleter.is_none() && !PyCallable_Check(deleter.ptr()))
    throw nb::type_error("deleter must be callable (it is called with the address) or None");
  auto once = std::make_shared<OnceCall>();
  once->fn = deleter;
  once->arg = address;
  // From here the memory is ours: every error calls the deleter before raising.
  try {
    uintptr_t addr = 0;
    if (!PyLong_Check(address.ptr()) || !nb::try_cast(address, addr) || addr == 0)
      throw std::invalid_argument("address must be a positive int, got " +
                                  std::string(nb::str(nb::repr(address)).c_str()));
    if (!nb::isinstance<nb::str>(dtype))
      throw std::invalid_argument("dtype must be a name such as 'float32', got " +
                                  std::string(nb::str(nb::repr(dtype)).c_str()));
    mx::Dtype t = dtype_from_name(nb::cast<std::string>(dtype));
    mx::Shape s = shape_from(shape);
    return make_array(reinterpret_cast<void*>(addr), std::move(s), t, once);
  } catch (...) {
    (*once)();
    throw;
  }
}

}  // namespace

NB_MODULE(_mlx_bridge, m) {
  m.doc() = "mlx.core.array objects over user memory via MLX's C++ array(data, shape, dtype, deleter).";
  nb::module_::import_("mlx.core");  // registers mlx.core.array with nanobind before any cast
  m.attr("MLX_VERSION") = mx::version();
  m.def("array_from_pointer", &array_from_pointer, "address"_a, "shape"_a, "dtype"_a, "deleter"_a = nb::none(),
        "An mlx.core.array over the memory at `address`; `deleter(address)` runs exactly once: "
        "when MLX is done with the memory (at once if MLX copied it), or before any error is raised.");
  // What a drain asks of a collective's output: was it ever scheduled, has it run (mlx_jupyter.cluster.rank.drain).
  m.def("status", [](const mx::array& a) {
          if (a.status() == mx::array::Status::unscheduled) return 0;
          return a.is_available() ? 2 : 1;
        }, "array"_a,
        "0: never scheduled (not evaluated), 1: scheduled, not finished, 2: available (its computation ran).");
}
