#include "mlxj/buffer.h"

#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

namespace mlxj {

namespace {

size_t checked_nbytes(const std::vector<int64_t>& shape, Dtype dtype) {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension " + std::to_string(d) + " in the shape");
    if (d && n > std::numeric_limits<size_t>::max() / size_t(d))
      throw std::invalid_argument("the shape's size overflows the address space");
    n *= size_t(d);
  }
  return n;
}

}  // namespace

// Ownership is taken at once: if the memory cannot be used (bad shape, null
// pointer, no memory for a copy) the deleter runs before the exception leaves.
UserBuffer::UserBuffer(void* ptr, std::vector<int64_t> shape, Dtype dtype, Deleter deleter)
    : data_(ptr), shape_(std::move(shape)), dtype_(dtype), nbytes_(0), deleter_(std::move(deleter)) {
  try {
    nbytes_ = checked_nbytes(shape_, dtype);
    if (nbytes_ && !ptr) throw std::invalid_argument("null pointer for a non-empty buffer");
    // Misaligned memory cannot be viewed as this dtype: copy it and release the original now.
    if (ptr && reinterpret_cast<uintptr_t>(ptr) % dtype_size(dtype) != 0) {
      try {
        owned_.reset(new uint8_t[nbytes_ ? nbytes_ : 1]);
      } catch (const std::bad_alloc&) {
        throw std::runtime_error("Unable to allocate " + std::to_string(nbytes_) + " bytes");
      }
      std::memcpy(owned_.get(), ptr, nbytes_);
      data_ = owned_.get();
      release(ptr);
    }
  } catch (...) {
    release(ptr);
    throw;
  }
}

void UserBuffer::release(void* ptr) {
  Deleter d = std::move(deleter_);
  deleter_ = nullptr;
  if (d) d(ptr);
}

UserBuffer::~UserBuffer() {
  if (deleter_) release(data_);
}

}  // namespace mlxj
