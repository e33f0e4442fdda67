// mlx_jupyter._core.Buffer: user memory viewed without copies, exported through the
// buffer protocol and DLPack.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <set>
#include <utility>

#include "bindings.h"
#include "mlxj/buffer.h"

namespace mlxj::py {

namespace {

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

int buffer_get(PyObject* self, Py_buffer* view, int flags) {
  PyBuffer* pb = nb::inst_ptr<PyBuffer>(self);
  const UserBuffer& b = *pb->buf;
  const char* fmt = dtype_format(b.dtype());
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

nb::object make_dlpack(nb::handle self) {
  PyBuffer& pb = nb::cast<PyBuffer&>(self);
  const UserBuffer& b = *pb.buf;
  std::vector<size_t> shape(b.shape().begin(), b.shape().end());
  nb::dlpack::dtype d{dtype_dlpack_code(b.dtype()), uint8_t(dtype_size(b.dtype()) * 8), 1};
  nb::ndarray<> arr(b.data(), shape.size(), shape.data(), self, nullptr, d, nb::device::cpu::value, 0);
  return nb::cast(arr);
}

}  // namespace

void bind_buffer(nb::module_& m) {
  using namespace nb::literals;
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
            AnyArray a;
            if (!nb::try_cast<AnyArray>(obj, a)) {  // (nb::cast would throw a bare std::bad_cast)
              InArray ro;
              if (nb::try_cast<InArray>(obj, ro))
                throw std::invalid_argument("Buffer.wrap: the object's memory is read-only, and a Buffer may be "
                                            "written into; pass a writable array (e.g. a copy)");
              throw nb::type_error(("Buffer.wrap: cannot view a '" + std::string(nb::inst_name(obj).c_str()) +
                                    "' object: pass CPU memory with the buffer protocol or DLPack (a numpy array, a CPU "
                                    "torch tensor) of a supported dtype").c_str());
            }
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
}

}  // namespace mlxj::py
