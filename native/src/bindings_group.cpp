// mlx_jupyter._core.Group: the collectives, with the GIL released around every blocking call.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "bindings.h"
#include "mlxj/errors.h"
#include "mlxj/socket.h"

namespace mlxj::py {

namespace {

// Ctrl-C without taking the GIL: a SIGINT handler chained in front of Python's
// counts signals, and a blocked op takes the GIL (PyErr_CheckSignals) only when the
// count moved, on its first check, and once a second for other signals' Python handlers.
std::atomic<unsigned> g_sigints{0};
std::mutex g_sig_mu;
struct sigaction g_sig_next{};  // the handler ours runs after (Python's), stable while ours is installed

extern "C" void count_sigint(int sig, siginfo_t* info, void* uc) {
  g_sigints.fetch_add(1, std::memory_order_relaxed);
  if (g_sig_next.sa_flags & SA_SIGINFO) {
    if (g_sig_next.sa_sigaction) g_sig_next.sa_sigaction(sig, info, uc);
  } else if (g_sig_next.sa_handler != SIG_DFL && g_sig_next.sa_handler != SIG_IGN) {
    g_sig_next.sa_handler(sig);
  }
}

// (Re)chains ours in front of the current SIGINT handler: Python code may have replaced it.
void chain_sigint() {
  std::lock_guard<std::mutex> lock(g_sig_mu);
  struct sigaction cur{};
  if (::sigaction(SIGINT, nullptr, &cur) != 0) return;
  bool ours = (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == count_sigint;
  if (ours || (!(cur.sa_flags & SA_SIGINFO) && (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN))) return;
  g_sig_next = cur;
  struct sigaction mine{};
  mine.sa_sigaction = count_sigint;
  mine.sa_flags = SA_SIGINFO | (cur.sa_flags & SA_ONSTACK);  // no SA_RESTART: poll() wakes with EINTR
  mine.sa_mask = cur.sa_mask;
  ::sigaction(SIGINT, &mine, nullptr);
}

thread_local unsigned t_sigints_seen = 0;
thread_local std::chrono::steady_clock::time_point t_next_full_check{};

bool signal_pending() {
  unsigned count = g_sigints.load(std::memory_order_relaxed);
  auto now = std::chrono::steady_clock::now();
  if (count == t_sigints_seen && now < t_next_full_check) return false;
  t_sigints_seen = count;
  t_next_full_check = now + std::chrono::seconds(1);
  chain_sigint();
  // Python runs signal handlers on its main thread only: another thread has nothing to check
  // (and taking the GIL there could end it, were the interpreter exiting).
  if (!on_main_thread()) return false;
  nb::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;  // sets KeyboardInterrupt; the translator leaves it in place
}

// The input's dtype, once both arrays are contiguous and `out` has that dtype and the size the
// op needs (`size_ok`); else an error saying what `out` must have.
Dtype check_in_out(const InArray& in, const AnyArray& out, bool size_ok, const char* out_must_have) {
  Dtype t = dtype_of(in);
  require_contiguous(in, "input");
  require_contiguous(out, "out");
  if (dtype_of(out) != t || !size_ok) throw std::invalid_argument(std::string("out must have ") + out_must_have);
  return t;
}

}  // namespace

CallOptions call(double timeout) {
  // Checked by the caller (mlx_jupyter.vocab.rank_env.check_seconds, the one rule): -1 waits;
  // inf, huge, and anything else the core cannot use as a deadline, waits too.
  CallOptions o;
  o.timeout = timeout;
  t_next_full_check = {};  // the op's first check takes the GIL once
  o.interrupted = signal_pending;
  return o;
}

namespace {

// The one representation of a reduction across the binding: its code (0 sum, 1 max, 2 min),
// as mlx_jupyter.collective.group.OPS maps the names.
ReduceOp reduce_op(int op) {
  if (op < 0 || op > 2) throw std::invalid_argument("unknown reduction code " + std::to_string(op) + " (0 sum, 1 max, 2 min)");
  return ReduceOp(op);
}

// A C-contiguous view through the buffer protocol, released on destruction;
// `ok` is false (no Python error left set) when the object offers none.
struct View {
  Py_buffer buf{};
  bool ok = false;
  View(nb::handle obj, bool writable) {
    ok = PyObject_GetBuffer(obj.ptr(), &buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) == 0;
    if (!ok) PyErr_Clear();
  }
  ~View() {
    if (ok) PyBuffer_Release(&buf);
  }
  View(const View&) = delete;
  View& operator=(const View&) = delete;
  bool dtype(Dtype* t) const { return dtype_from_format(buf.format, size_t(buf.itemsize), t); }
};

// Exactly numpy's ndarray (not subclasses): the only type the hot path takes.
PyTypeObject* ndarray_type() {
  static PyObject* type = nullptr;  // set once, under the GIL
  if (!type) type = nb::object(nb::module_::import_("numpy").attr("ndarray")).release().ptr();
  return reinterpret_cast<PyTypeObject*>(type);
}

// The hot paths' case: `in` and `out` exactly numpy arrays (looked at before their buffers
// are asked for), C-contiguous, of one dtype, `out` writable. `ok` is false for anything else.
struct NumpyPair {
  std::optional<View> in, out;
  Dtype t{};
  bool ok = false;
  NumpyPair(nb::handle i, nb::handle o) {
    PyTypeObject* nd = ndarray_type();
    if (Py_TYPE(i.ptr()) != nd || Py_TYPE(o.ptr()) != nd) return;
    in.emplace(i, false);
    out.emplace(o, true);
    Dtype to;
    ok = in->ok && out->ok && in->dtype(&t) && out->dtype(&to) && t == to;
  }
  size_t in_bytes() const { return size_t(in->buf.len); }
  size_t out_bytes() const { return size_t(out->buf.len); }
};

// The hot path of all_sum/max/min(x, out=out): a NumpyPair of one size. Returns false
// (nothing done, no error) for anything else, which then takes the general path.
bool all_reduce_buffers(Group& g, nb::handle in, nb::handle out, int op, double timeout) {
  if (op < 0 || op > 2) return false;
  NumpyPair p(in, out);
  if (!p.ok || p.in_bytes() != p.out_bytes()) return false;
  CallOptions o = call(timeout);
  GilRelease rel;
  g.all_reduce(p.in->buf.buf, p.out->buf.buf, p.in_bytes() / dtype_size(p.t), p.t, ReduceOp(op), o);
  return true;
}

// The same for all_gather(x, out=out): `out` holds size() times `x`'s bytes.
bool all_gather_buffers(Group& g, nb::handle in, nb::handle out, double timeout) {
  NumpyPair p(in, out);
  if (!p.ok || p.out_bytes() != p.in_bytes() * size_t(g.size())) return false;
  CallOptions o = call(timeout);
  GilRelease rel;
  g.all_gather(p.in->buf.buf, p.out->buf.buf, p.in_bytes(), p.t, o);
  return true;
}

}  // namespace

void bind_options(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<CoreOptions>(m, "CoreOptions",
                          "What the core is told when a world or a split is made (RankEnv fills it; the core "
                          "reads no environment variable).")
      .def(
          "__init__",
          [](CoreOptions* o, std::string token, bool verbose, bool shm, bool named_shm, bool board,
             double dead_peer_timeout, std::string host_id, size_t small_limit) {
            new (o) CoreOptions{std::move(token), verbose, shm,   named_shm,
                                board,            dead_peer_timeout, std::move(host_id), small_limit};
          },
          "token"_a = "", "verbose"_a = false, "shm"_a = true, "named_shm"_a = false, "board"_a = true,
          "dead_peer_timeout"_a = 10.0, "host_id"_a = "", "small_limit"_a = CoreOptions{}.small_limit)
      .def_rw("token", &CoreOptions::token, "The job's secret; peers prove they hold it.")
      .def_rw("verbose", &CoreOptions::verbose, "Log accepted and refused connections.")
      .def_rw("shm", &CoreOptions::shm, "Links between ranks of one host may use shared memory.")
      .def_rw("named_shm", &CoreOptions::named_shm, "Named POSIX shared memory even where memfd exists.")
      .def_rw("board", &CoreOptions::board, "Small ops of a one-host group of 3+ ranks go through the board.")
      .def_rw("dead_peer_timeout", &CoreOptions::dead_peer_timeout, "Seconds a silent peer host counts as alive.")
      .def_rw("host_id", &CoreOptions::host_id, "This machine's identity (\"\": the real one).")
      .def_rw("small_limit", &CoreOptions::small_limit, "All-reduces up to this many bytes gather, larger take the ring.");
}

// Whether an op of this kind moves elements of a dtype (init and barrier move none).
bool typed(OpKind k) { return k != OpKind::None && k != OpKind::Init && k != OpKind::Barrier; }

void bind_profile(nb::module_& m) {
  using namespace nb::literals;
  m.def("start_profile", &start_profiling, "capacity"_a,
        "Record every op of every group of this process from now on, keeping the newest `capacity` per group.");
  m.def("stop_profile", &stop_profiling, "Stop recording (the records stay until taken or the next start).");
  m.def("profiling", &profiling, "Whether ops are being recorded.");
  m.def("clock_ns", &steady_ns, "The clock of activity and profile times (steady), in nanoseconds.");
}

void bind_group(nb::module_& m) {
  using namespace nb::literals;
  bind_options(m);
  bind_profile(m);
  nb::class_<Group>(m, "Group", "A group of ranks of our core: the ring world, or a split of it.")
      .def_static(
          "world",
          [](int rank, const std::vector<std::vector<std::pair<std::string, int>>>& addrs, const CoreOptions& options,
             double timeout) {
            std::vector<std::vector<Endpoint>> eps;
            for (const auto& row : addrs) {
              eps.emplace_back();
              for (const auto& [host, port] : row) eps.back().push_back(Endpoint{host, port});
            }
            if (rank < 0 || rank >= int(eps.size())) throw std::invalid_argument("rank out of range");
            CallOptions o = call(timeout);
            GilRelease rel;
            return Group::world(rank, std::move(eps), options, o);
          },
          "rank"_a, "addresses"_a, "options"_a, "timeout"_a,
          "Forms the world: `addresses` per rank ((host, port) pairs, as mlx_jupyter.vocab.hosts.split_addr "
          "returns them), within `timeout` seconds.")
      .def_prop_ro("options", [](const Group& g) { return g.options(); }, "A copy of this group's CoreOptions.")
      .def("rank", &Group::rank)
      .def("size", &Group::size)
      .def("world_rank", &Group::world_rank)
      .def_prop_ro("id", &Group::id, "The group's id, the same on each of its ranks (the world's is 1).")
      .def("activity", [](const Group& g) {
        // Lock-free (activity.h): safe while another thread is blocked in an op of this group.
        ActivityView a = g.activity();
        nb::dict d;
        bool idle = a.state == OpState::Idle;
        d["state"] = op_state_name(a.state);
        d["op"] = idle ? nb::none() : nb::object(nb::str(op_kind_name(a.op)));
        d["seq"] = a.seq;
        d["nbytes"] = a.nbytes;
        d["dtype"] = typed(a.op) ? dtype_name(a.dtype) : "";
        d["elapsed"] = idle ? 0.0 : double(steady_ns() - a.start_ns) * 1e-9;
        d["waiting_on"] = a.waiting_on < 0 ? nb::none() : nb::object(nb::int_(a.waiting_on));
        d["moved"] = a.moved;
        d["timeout"] = idle || a.timeout_us < 0 ? nb::none() : nb::object(nb::float_(double(a.timeout_us) * 1e-6));
        return d;
      }, "What the group does now: a dict of state (idle, running, waiting), op (None when idle), seq, "
         "nbytes, dtype, elapsed (s), waiting_on (a group rank or None), moved (bytes), timeout (the op's, "
         "s, or None); never blocks.")
      .def("take_profile", [](Group& g) {
        uint64_t dropped = 0;
        std::vector<ProfileRecord> records = g.take_profile(&dropped);
        nb::list out;
        for (const ProfileRecord& r : records)
          out.append(nb::make_tuple(op_kind_name(r.op), r.seq, r.nbytes, typed(r.op) ? dtype_name(r.dtype) : "", r.start_ns, r.end_ns,
                                    r.wait_ns, r.waited_on, r.ok));
        return nb::make_tuple(out, dropped);
      }, "This group's records of the current profile, oldest first, as (op, seq, nbytes, dtype, start_ns, "
         "end_ns, wait_ns, waited_on, ok) tuples, and how many older ones the ring dropped; empties them.")
      .def_prop_ro("aborted", &Group::aborted)
      .def_prop_ro("abort_reason", &Group::abort_reason)
      .def("link_kinds", &Group::link_kinds, "Per link \"side:kind\" (kind shm or tcp), and \"board:shm\" once the group shares a board.")
      .def("abort", [](Group& g, const std::string& reason) {
        GilRelease rel;
        g.abort(reason);
      }, "reason"_a)
      .def("close", [](Group& g, const std::string& reason) {
        GilRelease rel;
        g.close(reason);
      }, "reason"_a)
      .def("split", [](Group& g, int color, int key, double timeout, std::optional<CoreOptions> options) {
        CallOptions o = call(timeout);
        GilRelease rel;
        return g.split(color, key, o, options ? &*options : nullptr);
      }, "color"_a, "key"_a, "timeout"_a, "options"_a = nb::none(),
      "Ranks calling with the same color form a new group; `options` (the same on each of them) replace "
      "this group's, except the connections' token, verbosity and dead-peer timeout.")
      .def("barrier", [](Group& g, double timeout) {
        CallOptions o = call(timeout);
        GilRelease rel;
        g.barrier(o);
      }, "timeout"_a)
      .def("all_reduce", [](Group& g, InArray in, AnyArray out, int op, double timeout) {
        Dtype t = check_in_out(in, out, out.size() == in.size(), "the input's dtype and size");
        CallOptions o = call(timeout);
        ReduceOp rop = reduce_op(op);
        GilRelease rel;
        g.all_reduce(in.data(), out.data(), in.size(), t, rop, o);
      }, "input"_a, "out"_a, "op"_a, "timeout"_a)
      .def("all_reduce_buffers", &all_reduce_buffers, "input"_a, "out"_a, "op"_a, "timeout"_a,
           "all_reduce of numpy arrays in place (op 0 sum, 1 max, 2 min); False when the arrays are not "
           "contiguous numpy arrays of one dtype and size (nothing done).")
      .def("all_gather_buffers", &all_gather_buffers, "input"_a, "out"_a, "timeout"_a,
           "all_gather of numpy arrays into out; False when they are not contiguous numpy arrays of one "
           "dtype, out holding size() times the input (nothing done).")
      .def("all_gather", [](Group& g, InArray in, AnyArray out, double timeout) {
        Dtype t = check_in_out(in, out, out.size() == in.size() * size_t(g.size()),
                               "the input's dtype and size() times its size");
        CallOptions o = call(timeout);
        GilRelease rel;
        g.all_gather(in.data(), out.data(), in.size() * dtype_size(t), t, o);
      }, "input"_a, "out"_a, "timeout"_a)
      .def("reduce_scatter", [](Group& g, InArray in, AnyArray out, int op, double timeout) {
        Dtype t = check_in_out(in, out, out.size() * size_t(g.size()) == in.size(),
                               "the input's dtype and 1/size() of its size");
        CallOptions o = call(timeout);
        ReduceOp rop = reduce_op(op);
        GilRelease rel;
        g.reduce_scatter(in.data(), out.data(), out.size(), t, rop, o);
      }, "input"_a, "out"_a, "op"_a, "timeout"_a)
      .def("send", [](Group& g, InArray in, int dst, double timeout) {
        Dtype t = dtype_of(in);
        require_contiguous(in, "input");
        CallOptions o = call(timeout);
        GilRelease rel;
        g.send(in.data(), in.size() * dtype_size(t), t, dst, o);
      }, "input"_a, "dst"_a, "timeout"_a)
      .def("recv", [](Group& g, AnyArray out, int src, double timeout) {
        Dtype t = dtype_of(out);
        require_contiguous(out, "out");
        CallOptions o = call(timeout);
        GilRelease rel;
        g.recv(out.data(), out.size() * dtype_size(t), t, src, o);
      }, "out"_a, "src"_a, "timeout"_a);
}

}  // namespace mlxj::py
