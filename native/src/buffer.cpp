#include "mlxj/buffer.h"

#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace mlxj {

UserBuffer::UserBuffer(void* ptr, std::vector<int64_t> shape, Dtype dtype, Deleter deleter)
    : data_(ptr), shape_(std::move(shape)), dtype_(dtype), deleter_(std::move(deleter)) {
  size_t n = 1;
  for (int64_t d : shape_) {
    if (d < 0) {
      if (deleter_) deleter_(ptr);
      throw std::invalid_argument("negative dimension in shape");
    }
    n *= size_t(d);
  }
  nbytes_ = n * dtype_size(dtype);
  if (nbytes_ && !ptr) throw std::invalid_argument("null pointer for a non-empty buffer");
  // Misaligned memory cannot be viewed as this dtype: copy it and release the original now.
  if (ptr && reinterpret_cast<uintptr_t>(ptr) % dtype_size(dtype) != 0) {
    try {
      owned_.reset(new uint8_t[nbytes_ ? nbytes_ : 1]);
    } catch (const std::bad_alloc&) {
      if (deleter_) deleter_(ptr);
      deleter_ = nullptr;
      throw std::runtime_error("Unable to allocate " + std::to_string(nbytes_) + " bytes");
    }
    std::memcpy(owned_.get(), ptr, nbytes_);
    data_ = owned_.get();
    if (deleter_) deleter_(ptr);
    deleter_ = nullptr;
  }
}

UserBuffer::~UserBuffer() {
  if (deleter_) deleter_(data_);
}

}  // namespace mlxj
