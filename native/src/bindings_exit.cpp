// Blocking calls and the interpreter's exit. A thread that takes the GIL back while the
// interpreter finalizes is ended by CPython 3.11-3.13 with a forced unwind, which nanobind's
// call dispatch (catch (...)) turns into std::terminate: SIGABRT at exit. So at exit (an atexit
// hook, run before finalization starts) threads still in a core call are let through once, and
// any thread but the exiting one that returns later parks instead of taking the GIL: the process
// is about to end, and a parked thread ends with it (CPython 3.14 parks such threads itself).
#include <atomic>
#include <chrono>
#include <thread>

#include "bindings.h"

namespace mlxj::py {

namespace {

std::atomic<bool> g_exiting{false};
std::atomic<int> g_reacquiring{0};  // threads between looking at g_exiting and holding the GIL
std::atomic<unsigned long> g_exit_thread{0};
unsigned long g_main_thread = 0;     // set at import, under the GIL

[[noreturn]] void park() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// The atexit hook (under the GIL): from now on returning threads park; those already on
// their way to the GIL get it first (bounded: a second at most).
void at_exit() {
  g_exit_thread.store(PyThread_get_thread_ident(), std::memory_order_seq_cst);
  g_exiting.store(true, std::memory_order_seq_cst);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (g_reacquiring.load(std::memory_order_seq_cst) > 0 && std::chrono::steady_clock::now() < until) {
    nb::gil_scoped_release rel;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

GilRelease::GilRelease() : state_(PyEval_SaveThread()) {}

GilRelease::~GilRelease() {
  // Dekker with at_exit(): either it sees us counted and waits, or we see the flag and park.
  g_reacquiring.fetch_add(1, std::memory_order_seq_cst);
  if (g_exiting.load(std::memory_order_seq_cst) &&
      PyThread_get_thread_ident() != g_exit_thread.load(std::memory_order_seq_cst)) {
    g_reacquiring.fetch_sub(1, std::memory_order_seq_cst);
    park();
  }
  PyEval_RestoreThread(state_);
  g_reacquiring.fetch_sub(1, std::memory_order_seq_cst);
}

bool on_main_thread() { return PyThread_get_thread_ident() == g_main_thread; }

void bind_exit(nb::module_& m) {
  g_main_thread = nb::cast<unsigned long>(nb::module_::import_("threading").attr("main_thread")().attr("ident"));
  // Objects still held by parked or daemon threads at exit are not leaks of ours to report.
  nb::set_leak_warnings(false);
  m.def("_at_exit", &at_exit, "Run by atexit: threads returning from a core call after this park (do not call).");
  nb::module_::import_("atexit").attr("register")(m.attr("_at_exit"));
}

}  // namespace mlxj::py
