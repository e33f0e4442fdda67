// Zero-copy user buffers: memory from a pointer, a shape, a dtype and
// a deleter. Used in place when suitably aligned; otherwise copied, and the
// deleter runs right after the copy. Either way the deleter runs exactly once:
// also when the constructor throws (bad shape, null pointer), before it does.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mlxj/dtype.h"

namespace mlxj {

class UserBuffer {
 public:
  using Deleter = std::function<void(void*)>;
  UserBuffer(void* ptr, std::vector<int64_t> shape, Dtype dtype, Deleter deleter);
  ~UserBuffer();
  UserBuffer(const UserBuffer&) = delete;
  UserBuffer& operator=(const UserBuffer&) = delete;

  void* data() const { return data_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  Dtype dtype() const { return dtype_; }
  size_t nbytes() const { return nbytes_; }
  size_t size() const { return nbytes_ / dtype_size(dtype_); }
  bool copied() const { return owned_ != nullptr; }
  // Runs the deleter now if it has not run (interpreter exit): the memory must not be used after.
  void run_deleter() {
    if (deleter_) release(data_);
  }

 private:
  void release(void* ptr);  // runs the deleter if it has not run yet

  void* data_;
  std::vector<int64_t> shape_;
  Dtype dtype_;
  size_t nbytes_;
  std::unique_ptr<uint8_t[]> owned_;  // set when the caller's memory could not be used in place
  Deleter deleter_;
};

}  // namespace mlxj
