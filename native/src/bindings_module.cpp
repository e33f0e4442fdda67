// The _core module: errors, groups, buffers, and the backend probes.
#include <nanobind/stl/string.h>

#include <cstdint>

#include "bindings.h"
#include "mlxj/activity.h"
#include "mlxj/dtype.h"
#include "mlxj/probe.h"
#include "mlxj/shm_ring_link.h"
#include "mlxj/shm_segment.h"
#include "mlxj/socket.h"

using namespace mlxj;

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  m.doc() = "mlx_jupyter's native collective core (TCP ring, user buffers, backend probes)";
  py::bind_errors(m);
  py::bind_group(m);
  py::bind_buffer(m);
  py::bind_exit(m);

  m.def("backends", [](const std::string& mpi_libname) {
    nb::list out;
    for (const auto& s : probe_backends(mpi_libname)) {
      nb::dict d;
      d["name"] = s.name;
      d["available"] = s.available;
      d["detail"] = s.detail;
      d["fix"] = s.fix;
      out.append(d);
    }
    return out;
  }, nb::arg("mpi_libname") = "",
  "For each backend: a dict of name, available, detail (what was found or is missing) and fix; "
  "`mpi_libname` (MLX_MPI_LIBNAME) is the MPI library tried first.");
  m.def(
      "_open_segment",
      [](const std::string& locator, size_t ring_bytes) {
        return open_segment(locator, shm_link_bytes(ring_bytes)) != nullptr;
      },
      "For tests: opens (and at once releases) a peer's shared memory as link setup does, from the locator "
      "it sent; raises MismatchError or SetupError when the locator is refused.");
  m.def("dtypes", [] {
    nb::list out;
    for (const char* name : dtype_list()) out.append(name);
    return nb::tuple(out);
  }, "The dtype names the core reduces and moves (its one table, native/src/dtype.cpp), in its order.");
  m.def("_set_paused", [](bool paused) { set_paused(paused); }, nanobind::arg("paused"),
        "This process is paused at a debugger's prompt (True) or runs again (False): a peer whose op waits "
        "for it does not time out meanwhile, and counts its timeout from the pause's end.");
  m.def("random_token", [] {
    uint8_t b[16];
    random_bytes(b, sizeof b);
    static const char* hex = "0123456789abcdef";
    std::string s;
    for (uint8_t c : b) { s += hex[c >> 4]; s += hex[c & 15]; }
    return s;
  }, "128 random bits as 32 hex digits (a job token).");
}
