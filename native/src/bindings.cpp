// The one file that knows Python: the core's types, errors and GIL handling.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <memory>
#include <set>
#include <mutex>
#include <utility>

#include "mlxj/buffer.h"
#include "mlxj/errors.h"
#include "mlxj/group.h"
#include "mlxj/probe.h"
#include "mlxj/shm_segment.h"
#include "mlxj/socket.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace mlxj;

namespace {

PyObject* g_errors[6] = {};  // indexed by ErrorKind

using AnyArray = nb::ndarray<nb::device::cpu>;
using InArray = nb::ndarray<nb::ro, nb::device::cpu>;

template <typename A>
Dtype dtype_of(const A& a) {
  auto d = a.dtype();
  if (d.lanes != 1) throw std::invalid_argument("vector dtypes are not supported");
  using C = nb::dlpack::dtype_code;
  switch (C(d.code)) {
    case C::Bool: return Dtype::Bool;
    case C::Int:
      if (d.bits == 8) return Dtype::Int8;
      if (d.bits == 16) return Dtype::Int16;
      if (d.bits == 32) return Dtype::Int32;
      if (d.bits == 64) return Dtype::Int64;
      break;
    case C::UInt:
      if (d.bits == 8) return Dtype::UInt8;
      if (d.bits == 16) return Dtype::UInt16;
      if (d.bits == 32) return Dtype::UInt32;
      if (d.bits == 64) return Dtype::UInt64;
      break;
    case C::Float:
      if (d.bits == 16) return Dtype::Float16;
      if (d.bits == 32) return Dtype::Float32;
      if (d.bits == 64) return Dtype::Float64;
      break;
    case C::Bfloat:
      if (d.bits == 16) return Dtype::BFloat16;
      break;
    case C::Complex:
      if (d.bits == 64) return Dtype::Complex64;
      break;
    default:
      break;
  }
  throw std::invalid_argument("unsupported dtype (code " + std::to_string(d.code) + ", " +
                              std::to_string(d.bits) + " bits): supported are bool, int8..int64, uint8..uint64, "
                              "float16, bfloat16, float32, float64, complex64");
}

nb::dlpack::dtype dl_dtype(Dtype t) {
  using C = nb::dlpack::dtype_code;
  nb::dlpack::dtype d{};
  d.lanes = 1;
  d.bits = uint8_t(dtype_size(t) * 8);
  switch (t) {
    case Dtype::Bool: d.code = uint8_t(C::Bool); break;
    case Dtype::Int8: case Dtype::Int16: case Dtype::Int32: case Dtype::Int64: d.code = uint8_t(C::Int); break;
    case Dtype::UInt8: case Dtype::UInt16: case Dtype::UInt32: case Dtype::UInt64: d.code = uint8_t(C::UInt); break;
    case Dtype::Float16: case Dtype::Float32: case Dtype::Float64: d.code = uint8_t(C::Float); break;
    case Dtype::BFloat16: d.code = uint8_t(C::Bfloat); break;
    case Dtype::Complex64: d.code = uint8_t(C::Complex); break;
  }
  return d;
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

template <typename A>
size_t nbytes_of(const A& a) { return a.size() * dtype_size(dtype_of(a)); }

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
  nb::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;  // sets KeyboardInterrupt; the translator leaves it in place
}

CallOptions call(double timeout) {
  // -1 waits; inf or huge means no deadline (the core clamps); NaN and other negatives are mistakes.
  if (std::isnan(timeout) || (timeout < 0 && timeout != -1))
    throw std::invalid_argument("timeout must be >= 0 seconds (or -1 to wait), got " + std::to_string(timeout));
  CallOptions o;
  o.timeout = timeout;
  t_next_full_check = {};  // the op's first check takes the GIL once
  o.interrupted = signal_pending;
  return o;
}

ReduceOp parse_op(const std::string& s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "max") return ReduceOp::Max;
  if (s == "min") return ReduceOp::Min;
  throw std::invalid_argument("unknown reduction '" + s + "' (sum, max, min)");
}

// A Python-visible user buffer: the core buffer, plus the Python object (if any)
// whose memory it views, kept alive as long as the buffer.
struct PyBuffer {
  std::unique_ptr<UserBuffer> buf;
  nb::object owner;
  // The owner's buffer export, held for the Buffer's life: a bytearray cannot
  // resize (BufferError) while it exists, so the memory cannot move under us.
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> view{nullptr, [](Py_buffer* v) {
                                                          PyBuffer_Release(v);
                                                          delete v;
                                                        }};
  PyBuffer();
  ~PyBuffer();
};

// Buffers whose Python deleter has not run (touched only under the GIL): the
// atexit hook runs them, so memory handed over by pointer is freed at exit too.
std::set<PyBuffer*>& live_buffers() {
  static std::set<PyBuffer*> live;
  return live;
}
PyBuffer::PyBuffer() { live_buffers().insert(this); }
PyBuffer::~PyBuffer() { live_buffers().erase(this); }

void run_pending_deleters() {
  std::vector<PyBuffer*> all(live_buffers().begin(), live_buffers().end());
  for (PyBuffer* pb : all)  // a deleter may free other buffers: look each one up again
    if (live_buffers().count(pb) && pb->buf) pb->buf->run_deleter();
}

const char* buffer_format(Dtype t) {
  switch (t) {
    case Dtype::Bool: return "?";
    case Dtype::Int8: return "b";
    case Dtype::Int16: return "h";
    case Dtype::Int32: return "i";
    case Dtype::Int64: return "q";
    case Dtype::UInt8: return "B";
    case Dtype::UInt16: return "H";
    case Dtype::UInt32: return "I";
    case Dtype::UInt64: return "Q";
    case Dtype::Float16: return "e";
    case Dtype::Float32: return "f";
    case Dtype::Float64: return "d";
    case Dtype::Complex64: return "Zf";
    case Dtype::BFloat16: return nullptr;
  }
  return nullptr;
}

int buffer_get(PyObject* self, Py_buffer* view, int flags) {
  PyBuffer* pb = nb::inst_ptr<PyBuffer>(self);
  const UserBuffer& b = *pb->buf;
  const char* fmt = buffer_format(b.dtype());
  if (!fmt) {
    PyErr_SetString(PyExc_BufferError,
                    "bfloat16 has no buffer-protocol format: view this Buffer through DLPack "
                    "(torch.from_dlpack(buf), mx.array(buf)) instead");
    view->obj = nullptr;
    return -1;
  }
  size_t nd = b.shape().size();
  auto* dims = static_cast<Py_ssize_t*>(PyMem_Malloc(sizeof(Py_ssize_t) * (2 * nd + 1)));
  if (!dims) {
    PyErr_NoMemory();
    return -1;
  }
  Py_ssize_t stride = Py_ssize_t(dtype_size(b.dtype()));
  for (size_t i = nd; i-- > 0;) {
    dims[i] = Py_ssize_t(b.shape()[i]);
    dims[nd + i] = stride;
    stride *= dims[i];
  }
  view->buf = b.data();
  view->obj = self;
  Py_INCREF(self);
  view->len = Py_ssize_t(b.nbytes());
  view->readonly = 0;
  view->itemsize = Py_ssize_t(dtype_size(b.dtype()));
  view->format = (flags & PyBUF_FORMAT) ? const_cast<char*>(fmt) : nullptr;
  view->ndim = int(nd);
  view->shape = (flags & PyBUF_ND) ? dims : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? dims + nd : nullptr;
  view->suboffsets = nullptr;
  view->internal = dims;
  return 0;
}

void buffer_release(PyObject*, Py_buffer* view) { PyMem_Free(view->internal); }

PyType_Slot buffer_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(buffer_get)},
    {Py_bf_releasebuffer, reinterpret_cast<void*>(buffer_release)},
    {0, nullptr},
};

// The dtype of a struct format ("f", "<i", "Zf", ...) with items of `size` bytes; false if unsupported.
bool dtype_of_format(const char* f, size_t size, Dtype* t) {
  if (!f) f = "B";
  if (*f == '<' || *f == '=' || *f == '@' || *f == '|') ++f;
  if (f[0] == 'Z' && f[1] == 'f' && !f[2]) {
    *t = Dtype::Complex64;
  } else if (!f[0] || f[1]) {
    return false;
  } else {
    switch (f[0]) {
      case '?': *t = Dtype::Bool; break;
      case 'b': *t = Dtype::Int8; break;
      case 'B': *t = Dtype::UInt8; break;
      case 'h': *t = Dtype::Int16; break;
      case 'H': *t = Dtype::UInt16; break;
      case 'i': *t = Dtype::Int32; break;
      case 'I': *t = Dtype::UInt32; break;
      case 'l': *t = size == 4 ? Dtype::Int32 : Dtype::Int64; break;
      case 'L': *t = size == 4 ? Dtype::UInt32 : Dtype::UInt64; break;
      case 'q': *t = Dtype::Int64; break;
      case 'Q': *t = Dtype::UInt64; break;
      case 'e': *t = Dtype::Float16; break;
      case 'f': *t = Dtype::Float32; break;
      case 'd': *t = Dtype::Float64; break;
      default: return false;
    }
  }
  return dtype_size(*t) == size;
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
  bool dtype(Dtype* t) const { return dtype_of_format(buf.format, size_t(buf.itemsize), t); }
};

// Exactly numpy's ndarray (not subclasses): the only type the hot path takes.
PyTypeObject* ndarray_type() {
  static PyObject* type = nullptr;  // set once, under the GIL
  if (!type) type = nb::object(nb::module_::import_("numpy").attr("ndarray")).release().ptr();
  return reinterpret_cast<PyTypeObject*>(type);
}

nb::object make_dlpack(nb::handle self) {
  PyBuffer& pb = nb::cast<PyBuffer&>(self);
  const UserBuffer& b = *pb.buf;
  std::vector<size_t> shape(b.shape().begin(), b.shape().end());
  nb::ndarray<> arr(b.data(), shape.size(), shape.data(), self, nullptr, dl_dtype(b.dtype()),
                    nb::device::cpu::value, 0);
  return nb::cast(arr);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "mlx_jupyter's native collective core (TCP ring, user buffers, backend probes)";

  PyObject* base = PyErr_NewExceptionWithDoc("mlx_jupyter._core.DistributedError",
                                             "A distributed operation failed.", PyExc_RuntimeError, nullptr);
  auto sub = [&](const char* name, const char* doc, PyObject* extra) {
    PyObject* bases = extra ? PyTuple_Pack(2, base, extra) : PyTuple_Pack(1, base);
    PyObject* cls = PyErr_NewExceptionWithDoc(name, doc, bases, nullptr);
    Py_DECREF(bases);
    return cls;
  };
  g_errors[int(ErrorKind::Peer)] = sub("mlx_jupyter._core.PeerError", "A peer died, disconnected or stopped responding.", nullptr);
  g_errors[int(ErrorKind::Timeout)] = sub("mlx_jupyter._core.CommTimeoutError", "An operation exceeded its timeout.", PyExc_TimeoutError);
  g_errors[int(ErrorKind::Aborted)] = sub("mlx_jupyter._core.AbortedError", "The group was aborted.", nullptr);
  g_errors[int(ErrorKind::Protocol)] = sub("mlx_jupyter._core.MismatchError", "Ranks called different operations.", nullptr);
  g_errors[int(ErrorKind::Config)] = sub("mlx_jupyter._core.SetupError", "The group could not be formed as configured.", nullptr);
  g_errors[int(ErrorKind::Interrupted)] = PyExc_KeyboardInterrupt;
  m.attr("DistributedError") = nb::handle(base);
  m.attr("PeerError") = nb::handle(g_errors[int(ErrorKind::Peer)]);
  m.attr("CommTimeoutError") = nb::handle(g_errors[int(ErrorKind::Timeout)]);
  m.attr("AbortedError") = nb::handle(g_errors[int(ErrorKind::Aborted)]);
  m.attr("MismatchError") = nb::handle(g_errors[int(ErrorKind::Protocol)]);
  m.attr("SetupError") = nb::handle(g_errors[int(ErrorKind::Config)]);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Interrupted&) {
      if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const CommError& e) {
      PyErr_SetString(g_errors[int(e.kind())], e.what());
    }
  });

  nb::class_<Group>(m, "Group")
      .def_static(
          "world",
          [](int rank, const std::vector<std::vector<std::string>>& addrs, const std::string& token, bool verbose,
             double timeout) {
            std::vector<std::vector<Endpoint>> eps;
            for (const auto& row : addrs) {
              eps.emplace_back();
              for (const auto& a : row) eps.back().push_back(parse_endpoint(a));
            }
            if (rank < 0 || rank >= int(eps.size())) throw std::invalid_argument("rank out of range");
            CallOptions o = call(timeout);
            nb::gil_scoped_release rel;
            return Group::world(rank, std::move(eps), token, verbose, o);
          },
          "rank"_a, "addresses"_a, "token"_a, "verbose"_a, "timeout"_a)
      .def("rank", &Group::rank)
      .def("size", &Group::size)
      .def("world_rank", &Group::world_rank)
      .def_prop_ro("aborted", &Group::aborted)
      .def_prop_ro("abort_reason", &Group::abort_reason)
      .def("link_kinds", &Group::link_kinds)
      .def("abort", [](Group& g, const std::string& reason) {
        nb::gil_scoped_release rel;
        g.abort(reason);
      })
      .def("close", [](Group& g, const std::string& reason) {
        nb::gil_scoped_release rel;
        g.close(reason);
      })
      .def("split", [](Group& g, int color, int key, double timeout) {
        CallOptions o = call(timeout);
        nb::gil_scoped_release rel;
        return g.split(color, key, o);
      })
      .def("barrier", [](Group& g, double timeout) {
        CallOptions o = call(timeout);
        nb::gil_scoped_release rel;
        g.barrier(o);
      })
      .def("all_reduce", [](Group& g, InArray in, AnyArray out, const std::string& op, double timeout) {
        Dtype t = dtype_of(in);
        require_contiguous(in, "input");
        require_contiguous(out, "out");
        if (dtype_of(out) != t || out.size() != in.size())
          throw std::invalid_argument("out must have the input's dtype and size");
        CallOptions o = call(timeout);
        ReduceOp rop = parse_op(op);
        nb::gil_scoped_release rel;
        g.all_reduce(in.data(), out.data(), in.size(), t, rop, o);
      })
      .def("all_reduce_buffers",
           [](Group& g, nb::handle in, nb::handle out, int op, double timeout) {
             // The hot path: numpy arrays, contiguous, of one dtype and size. Returns
             // False (nothing done, no error) for anything else, which takes the general path.
             if (Py_TYPE(in.ptr()) != ndarray_type() || Py_TYPE(out.ptr()) != ndarray_type() || op < 0 || op > 2)
               return false;
             View vi(in, false), vo(out, true);
             Dtype ti, to;
             if (!vi.ok || !vo.ok || !vi.dtype(&ti) || !vo.dtype(&to) || ti != to || vi.buf.len != vo.buf.len)
               return false;
             CallOptions o = call(timeout);
             nb::gil_scoped_release rel;
             g.all_reduce(vi.buf.buf, vo.buf.buf, size_t(vi.buf.len) / dtype_size(ti), ti, ReduceOp(op), o);
             return true;
           })
      .def("all_gather", [](Group& g, InArray in, AnyArray out, double timeout) {
        Dtype t = dtype_of(in);
        require_contiguous(in, "input");
        require_contiguous(out, "out");
        if (dtype_of(out) != t || out.size() != in.size() * size_t(g.size()))
          throw std::invalid_argument("out must have the input's dtype and size() times its size");
        CallOptions o = call(timeout);
        nb::gil_scoped_release rel;
        g.all_gather(in.data(), out.data(), nbytes_of(in), t, o);
      })
      .def("reduce_scatter", [](Group& g, InArray in, AnyArray out, const std::string& op, double timeout) {
        Dtype t = dtype_of(in);
        require_contiguous(in, "input");
        require_contiguous(out, "out");
        if (dtype_of(out) != t || out.size() * size_t(g.size()) != in.size())
          throw std::invalid_argument("out must have the input's dtype and 1/size() of its size");
        CallOptions o = call(timeout);
        ReduceOp rop = parse_op(op);
        nb::gil_scoped_release rel;
        g.reduce_scatter(in.data(), out.data(), out.size(), t, rop, o);
      })
      .def("send", [](Group& g, InArray in, int dst, double timeout) {
        Dtype t = dtype_of(in);
        require_contiguous(in, "input");
        CallOptions o = call(timeout);
        nb::gil_scoped_release rel;
        g.send(in.data(), nbytes_of(in), t, dst, o);
      })
      .def("recv", [](Group& g, AnyArray out, int src, double timeout) {
        Dtype t = dtype_of(out);
        require_contiguous(out, "out");
        CallOptions o = call(timeout);
        nb::gil_scoped_release rel;
        g.recv(out.data(), nbytes_of(out), t, src, o);
      });

  nb::class_<PyBuffer>(m, "Buffer", nb::type_slots(buffer_slots),
                       "Memory shared without copies: a view of another object's buffer, or of a raw pointer.")
      .def_static(
          "wrap",
          [](nb::object obj) {
            auto pb = std::make_unique<PyBuffer>();
            if (PyObject_CheckBuffer(obj.ptr())) {  // exported before the cast, so it cannot move after
              auto v = std::make_unique<Py_buffer>();
              if (PyObject_GetBuffer(obj.ptr(), v.get(), PyBUF_FULL_RO) == 0)
                pb->view.reset(v.release());
              else
                PyErr_Clear();  // the cast below says what is wrong with it
            }
            AnyArray a = nb::cast<AnyArray>(obj);
            require_contiguous(a, "the wrapped object");
            std::vector<int64_t> shape;
            for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(int64_t(a.shape(i)));
            pb->buf = std::make_unique<UserBuffer>(a.data(), shape, dtype_of(a), nullptr);
            pb->owner = obj;
            return pb.release();
          },
          "obj"_a, nb::rv_policy::take_ownership, "View `obj`'s memory (buffer protocol or DLPack) without copying; keeps `obj` alive.")
      .def_static(
          "from_pointer",
          [](nb::object address, nb::object shape, nb::object dtype, nb::object deleter) {
            // A deleter that cannot be called is refused before anything else; from then on
            // the buffer owns the memory: every error below calls deleter(address) first.
            if (!deleter.is_none() && !PyCallable_Check(deleter.ptr()))
              throw nb::type_error("deleter must be callable (it is called with the address) or None");
            UserBuffer::Deleter del;
            if (!deleter.is_none()) {
              auto cb = std::make_shared<std::pair<nb::object, nb::object>>(deleter, address);
              del = [cb](void*) {
                nb::gil_scoped_acquire gil;
                try {
                  cb->first(cb->second);
                } catch (nb::python_error& e) {
                  e.discard_as_unraisable("mlx_jupyter.Buffer deleter");
                }
              };
            }
            uintptr_t addr = 0;
            std::vector<int64_t> dims;
            Dtype t = Dtype::UInt8;
            try {
              if (!nb::try_cast(address, addr) || !PyLong_Check(address.ptr()))
                throw std::invalid_argument("address must be a non-negative int, got " +
                                            std::string(nb::str(nb::repr(address)).c_str()));
              if (!nb::try_cast(shape, dims))
                throw std::invalid_argument("shape must be a sequence of ints, got " +
                                            std::string(nb::str(nb::repr(shape)).c_str()));
              if (!nb::isinstance<nb::str>(dtype)) throw std::invalid_argument("dtype must be a name such as 'float32'");
              t = dtype_from_name(nb::cast<std::string>(dtype));
            } catch (...) {
              if (del) del(nullptr);
              throw;
            }
            auto pb = std::make_unique<PyBuffer>();
            pb->buf = std::make_unique<UserBuffer>(reinterpret_cast<void*>(addr), std::move(dims), t, std::move(del));
            return pb.release();
          },
          "address"_a, "shape"_a, "dtype"_a, "deleter"_a = nb::none(), nb::rv_policy::take_ownership,
          "Use memory at `address` in place; `deleter(address)` runs exactly once: when the buffer dies, at once if "
          "the memory had to be copied, before any error is raised, or at interpreter exit (atexit) if the buffer "
          "is still alive then.")
      .def_prop_ro("address", [](const PyBuffer& b) { return uintptr_t(b.buf->data()); })
      .def_prop_ro("shape", [](const PyBuffer& b) { return b.buf->shape(); })
      .def_prop_ro("dtype", [](const PyBuffer& b) { return std::string(dtype_name(b.buf->dtype())); })
      .def_prop_ro("nbytes", [](const PyBuffer& b) { return b.buf->nbytes(); })
      .def_prop_ro("copied", [](const PyBuffer& b) { return b.buf->copied(); },
                   "True when the memory was misaligned and had to be copied (its deleter has then already run).")
      .def("__dlpack__", [](nb::handle self, nb::args, nb::kwargs) { return make_dlpack(self); })
      .def("__dlpack_device__", [](nb::handle) { return nb::make_tuple(1, 0); })
      .def("__len__", [](const PyBuffer& b) { return b.buf->shape().empty() ? 1 : size_t(b.buf->shape()[0]); })
      .def("__repr__", [](const PyBuffer& b) {
        std::string s = "Buffer(shape=(";
        for (auto d : b.buf->shape()) s += std::to_string(d) + ",";
        return s + "), dtype=" + dtype_name(b.buf->dtype()) + ")";
      });

  nb::module_::import_("atexit").attr("register")(nb::cpp_function(run_pending_deleters));

  m.def("backends", [] {
    nb::list out;
    for (const auto& s : probe_backends()) {
      nb::dict d;
      d["name"] = s.name;
      d["available"] = s.available;
      d["detail"] = s.detail;
      d["fix"] = s.fix;
      out.append(d);
    }
    return out;
  });
  m.def(
      "_open_segment",
      [](const std::string& locator, size_t ring_bytes) { return open_segment(locator, ring_bytes) != nullptr; },
      "For tests: opens (and at once releases) a peer's shared memory as link setup does, from the locator "
      "it sent; raises MismatchError or SetupError when the locator is refused.");
  m.def("random_token", [] {
    uint8_t b[16];
    random_bytes(b, sizeof b);
    static const char* hex = "0123456789abcdef";
    std::string s;
    for (uint8_t c : b) { s += hex[c >> 4]; s += hex[c & 15]; }
    return s;
  });
}
