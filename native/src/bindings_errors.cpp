// The core's errors as Python exceptions: DistributedError and one subclass per ErrorKind.
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "mlxj/errors.h"

#include <string>

namespace mlxj::py {

namespace {
nb::object g_types[6];  // by ErrorKind; module-lifetime, so never released

// A subclass of `base` (and `extra`), set on `m`; the kind translator below raises it.
nb::object subclass(nb::module_& m, const char* name, const char* doc, nb::handle base, PyObject* extra) {
  nb::object bases = extra ? nb::make_tuple(base, nb::handle(extra)) : nb::make_tuple(base);
  std::string full = nb::cast<std::string>(m.attr("__name__")) + "." + name;
  nb::object cls = nb::steal(PyErr_NewExceptionWithDoc(full.c_str(), doc, bases.ptr(), nullptr));
  if (!cls.is_valid()) throw nb::python_error();
  m.attr(name) = cls;
  return cls;
}
}  // namespace

void bind_errors(nb::module_& m) {
  // Any CommError not matched below becomes the base class (nb::exception registers that translation).
  nb::exception<CommError> base(m, "DistributedError", PyExc_RuntimeError);
  base.attr("__doc__") = "A distributed operation failed.";
  g_types[int(ErrorKind::Peer)] = subclass(m, "PeerError", "A peer died, disconnected or stopped responding.", base, nullptr);
  g_types[int(ErrorKind::Timeout)] = subclass(m, "CommTimeoutError", "An operation exceeded its timeout.", base, PyExc_TimeoutError);
  g_types[int(ErrorKind::Aborted)] = subclass(m, "AbortedError", "The group was aborted.", base, nullptr);
  g_types[int(ErrorKind::Protocol)] = subclass(m, "MismatchError", "Ranks called different operations.", base, nullptr);
  g_types[int(ErrorKind::Config)] = subclass(m, "SetupError", "The group could not be formed as configured.", base, nullptr);
  g_types[int(ErrorKind::Interrupted)] = nb::borrow(PyExc_KeyboardInterrupt);
  for (auto& t : g_types) t.inc_ref();  // kept for the process's life: the translator may run during teardown

  // Registered last, so nanobind tries it first: the subclass of the error's kind.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Interrupted&) {
      if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);  // the hook left the signal's exception set
    } catch (const CommError& e) {
      PyErr_SetString(g_types[int(e.kind())].ptr(), e.what());
    }
  });
}

}  // namespace mlxj::py
