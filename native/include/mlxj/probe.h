// Which distributed backends can run on this machine, and if not, why and how to fix it.
#pragma once
#include <string>
#include <vector>

namespace mlxj {

struct BackendStatus {
  std::string name;
  bool available;
  std::string detail;  // what was found, or why it is missing
  std::string fix;     // empty when available
};

// `mpi_libname`: the MPI library MLX would load (MLX_MPI_LIBNAME), tried first; "" for none.
std::vector<BackendStatus> probe_backends(const std::string& mpi_libname = "");

}  // namespace mlxj
