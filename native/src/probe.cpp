#include "mlxj/probe.h"

#include <cstring>
#include <dlfcn.h>
#include <sys/stat.h>

#include "mlxj/platform.h"

namespace mlxj {

namespace {

// The first library of the list that loads, or "" (with the last dlerror in *why).
std::string loadable(const std::vector<std::string>& names, std::string* why) {
  for (const auto& n : names) {
    if (n.empty()) continue;
    if (void* h = ::dlopen(n.c_str(), RTLD_LAZY | RTLD_LOCAL)) {
      ::dlclose(h);
      return n;
    }
    if (const char* e = ::dlerror()) *why = e;
  }
  return "";
}

bool exists(const char* path) {
  struct stat st;
  return ::stat(path, &st) == 0;
}

BackendStatus probe_mpi(const std::string& libname) {
  std::string why = "none of libmpi.so.40, libmpi.so.12, libmpi.so, libmpi.dylib loads";
  std::string lib = loadable({libname, "libmpi.so.40", "libmpi.so.12", "libmpi.so", "libmpi.dylib",
                              "/opt/homebrew/lib/libmpi.dylib", "/usr/local/lib/libmpi.dylib"},
                             &why);
  if (!lib.empty()) return {"mpi", true, "MPI library " + lib, ""};
  return {"mpi", false, "no MPI library found (" + why + ")",
          std::string(platform::macos() ? "brew install open-mpi" : "apt-get install openmpi-bin libopenmpi3") +
              " (or set MLX_MPI_LIBNAME to the path of libmpi)"};
}

BackendStatus probe_nccl() {
  if (platform::macos()) return {"nccl", false, "NCCL needs NVIDIA GPUs; Macs have none", "use ring or jaccl on a Mac"};
  std::string why;
  if (loadable({"libcuda.so.1", "libcuda.so"}, &why).empty() && !exists("/proc/driver/nvidia/version"))
    return {"nccl", false, "no NVIDIA driver (libcuda.so.1 not found)",
            "install the NVIDIA driver (>= 550.54.14; >= 580 for CUDA 13) on a machine with a GPU of compute capability >= 7.5"};
  why = "libnccl.so.2 not found";
  std::string lib = loadable({"libnccl.so.2", "libnccl.so"}, &why);
  if (lib.empty())
    return {"nccl", false, "NVIDIA driver present but no NCCL library (" + why + ")",
            "pip install 'mlx-jupyter[cuda12]' (or [cuda13]), which brings MLX's CUDA build and NCCL"};
  return {"nccl", true, "NVIDIA driver and " + lib, ""};
}

BackendStatus probe_jaccl(const char* name) {
  if (!platform::macos())
    return {name, false, "JACCL is RDMA over Thunderbolt 5, on macOS 26.2+ only",
            "on Linux use ring (TCP), nccl (NVIDIA GPUs) or mpi"};
  std::string why = "librdma.dylib not found";
  std::string lib = loadable({"librdma.dylib", "/usr/lib/librdma.dylib"}, &why);
  if (lib.empty())
    return {name, false, "no RDMA library (needs macOS 26.2 or later with Thunderbolt 5)",
            "update to macOS 26.2+, then enable RDMA in recovery mode: `rdma_ctl enable`, and reboot"};
  void* h = ::dlopen(lib.c_str(), RTLD_LAZY | RTLD_LOCAL);
  using ListFn = void** (*)(int*);
  using FreeFn = void (*)(void**);
  auto list = h ? reinterpret_cast<ListFn>(::dlsym(h, "ibv_get_device_list")) : nullptr;
  auto release = h ? reinterpret_cast<FreeFn>(::dlsym(h, "ibv_free_device_list")) : nullptr;
  int count = 0;
  if (list) {
    void** devs = list(&count);
    if (devs && release) release(devs);
  }
  if (h) ::dlclose(h);
  if (count <= 0)
    return {name, false, "RDMA library present but no RDMA device (RDMA is disabled)",
            "boot into recovery mode, run `rdma_ctl enable`, reboot; `ibv_devices` should then list rdma_en* devices"};
  return {name, true, std::to_string(count) + " RDMA device(s)", ""};
}

}  // namespace

std::vector<BackendStatus> probe_backends(const std::string& mpi_libname) {
  return {
      {"ring", true, "TCP sockets (built in)", ""},
      probe_jaccl("jaccl"),
      probe_jaccl("jaccl-ring"),
      probe_nccl(),
      probe_mpi(mpi_libname),
  };
}

}  // namespace mlxj
