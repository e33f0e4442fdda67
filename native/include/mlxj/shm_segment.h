// The shared-memory segment two ranks on one host share: the operating-system
// mechanics (create, open, size, seal, map, name, unlink). The ring protocol
// that runs over it is in shm_ring_link.h.
//
// Why this mechanism: an anonymous shared segment (memfd on Linux) has no name
// in any filesystem, so nothing is left behind after any exit, SIGKILL
// included. Cross-memory attach (process_vm_readv) would need ptrace rights
// that hardened hosts deny and does not exist on macOS.
//
// Who can reach the memory. The boundary is the user id: other users and other
// hosts cannot, a process of the same uid can. On Linux the peer opens the
// segment as /proc/<pid>/fd/N, which any process of the same uid may open too
// (as it may read /proc/<pid>/environ, which holds the job token); the creator
// closes N as soon as the peer has mapped the segment, after which only the two
// ranks' mappings remain (readable by the same uid where ptrace is allowed). On
// macOS the segment is a POSIX shm object of mode 0600 whose name exists only
// during the handover. The token authenticates the handover: the locator travels
// only over a connection that proved it, and the peer maps only a segment of
// ours carrying the random nonce the locator names.
//
// Nothing read from the segment is trusted: the ring size is the one this
// process asked for (never re-read), and the ring link checks every counter it
// loads. On Linux the memfd is sealed against shrinking and growing, so no one
// can truncate it under a mapping (which would be SIGBUS); the opener refuses an
// unsealed one. POSIX shm objects (macOS) cannot be sealed.
//
// macOS names: /mlxj.<uid>.<slot>, taken with O_EXCL. The peer unlinks the name
// as soon as it has opened it; the creator does if the peer did not open it (or
// on any failure). A creator killed between creating and the peer's open leaves
// the name behind; the segment records the creator's pid, and every process
// removes such stale names (creator gone) before it creates its first segment.
// If another process wins a race for a slot, the nonce no longer matches and
// that link falls back to TCP.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mlxj/socket.h"

namespace mlxj {

// Shared state of one direction; each counter on its own cache line.
struct alignas(64) RingState {
  alignas(64) std::atomic<uint64_t> written{0};  // bytes the producer has published
  alignas(64) std::atomic<uint64_t> read{0};     // bytes the consumer has released
  alignas(64) std::atomic<uint32_t> consumer_waiting{0};
  alignas(64) std::atomic<uint32_t> producer_waiting{0};
};

struct SegmentLayout {
  uint64_t magic;
  uint64_t ring_bytes;
  uint64_t nonce;       // also in the locator: the peer maps only the segment it was told about
  int64_t creator_pid;  // a named object whose creator is gone is stale
  RingState dir[2];     // 0: creator -> opener, 1: opener -> creator
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "cross-process atomics must be lock-free");

class SharedSegment {
 public:
  SharedSegment(void* base, size_t size, size_t ring_bytes, std::string locator, std::string name);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  SegmentLayout* layout() const { return static_cast<SegmentLayout*>(base_); }
  // The ring of direction d; its size is ring_bytes(), this process's own number.
  uint8_t* ring(int d) const { return static_cast<uint8_t*>(base_) + sizeof(SegmentLayout) + size_t(d) * ring_bytes_; }
  size_t ring_bytes() const { return ring_bytes_; }
  // Both rings' bytes as one area, for a segment shared by a whole group (board.h).
  uint8_t* area() const { return ring(0); }
  const std::string& locator() const { return locator_; }
  // The peer unlinks the name once it has opened it; we do when it did not.
  void release_name(bool peer_unlinked = false);
  Fd keep;  // Linux memfd: open until the peer has opened it through /proc

 private:
  void* base_;
  size_t size_, ring_bytes_;
  std::string locator_, name_;
};

// Creates a segment of `ring_bytes` per direction; `locator()` tells the peer how to open it.
// MLX_JUPYTER_SHM=named uses the macOS mechanism on Linux too (for tests).
std::shared_ptr<SharedSegment> create_segment(size_t ring_bytes);
// Opens the peer's segment; throws CommError(Config) if the locator is not a segment of ours.
// A named object is unlinked once opened, unless more ranks still have to open it
// (`last_opener` false): the creator then removes the name when all have.
std::shared_ptr<SharedSegment> open_segment(const std::string& locator, size_t ring_bytes, bool last_opener = true);
std::string segment_locator(const SharedSegment& s);
// Called by the creator once the peer has answered: closes the memfd and
// removes the name, unless the peer opened the segment (it has removed the name).
void segment_release_name(SharedSegment& s, bool peer_opened);

}  // namespace mlxj
