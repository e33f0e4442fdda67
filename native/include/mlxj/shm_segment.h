// A shared-memory segment of ranks on one host: the operating-system mechanics
// (create, open, size, seal, map, name, unlink) and a small header that identifies
// the segment. What lives in its payload is its users' business: the two rings of
// a link (shm_ring_link.cpp) or a group's board (board.h).
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
// Nothing read from the segment is trusted: the payload size is the one this
// process asked for (never re-read), and its users check what they load. On Linux
// the memfd is sealed against shrinking and growing, so no one can truncate it
// under a mapping (which would be SIGBUS); the opener refuses an unsealed one.
// POSIX shm objects (macOS) cannot be sealed. Which mechanism is the platform's
// (platform.h: anonymous segments where the OS has them).
//
// macOS names: /mlxj.<uid>.<slot>, taken with O_EXCL. The peer unlinks the name
// as soon as it has opened it; the creator does if the peer did not open it (or
// on any failure). A creator killed between creating and the peer's open leaves
// the name behind; the segment records the creator's pid, and every process
// removes such stale names (creator gone) before it creates its first segment.
// If another process wins a race for a slot, the nonce no longer matches and
// that link falls back to TCP.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mlxj/fd.h"

namespace mlxj {

// The segment's own header, before the payload (which starts 64-byte aligned).
struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint64_t payload_bytes;
  uint64_t nonce;       // also in the locator: the peer maps only the segment it was told about
  int64_t creator_pid;  // a named object whose creator is gone is stale
};

class SharedSegment {
 public:
  // `keep`: the creator's anonymous segment, open until the peer has opened it through /proc.
  SharedSegment(void* base, size_t size, std::string locator, std::string name, Fd keep = Fd());
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  // The payload: payload_bytes() bytes, this process's own number, after the header.
  uint8_t* payload() const { return static_cast<uint8_t*>(base_) + sizeof(SegmentHeader); }
  size_t payload_bytes() const { return size_ - sizeof(SegmentHeader); }
  // How a process of this user opens it (open_segment); sent only over authenticated connections.
  const std::string& locator() const { return locator_; }
  // Called by the creator once the peers have answered: closes the anonymous segment's
  // descriptor and removes the name, unless a peer that opened it removed the name already.
  void release_name(bool peer_unlinked = false);

 private:
  void* base_;
  size_t size_;
  std::string locator_, name_;
  Fd keep_;
};

// Creates a segment with `payload_bytes` of payload, zeroed; `named` uses POSIX named objects
// even where anonymous ones exist (macOS's mechanism, for tests on Linux).
std::shared_ptr<SharedSegment> create_segment(size_t payload_bytes, bool named);
// Opens the peer's segment; throws CommError(Protocol) if the locator is not a segment of ours
// of this payload size. A named object is unlinked once opened, unless more ranks still have
// to open it (`last_opener` false): the creator then removes the name when all have.
std::shared_ptr<SharedSegment> open_segment(const std::string& locator, size_t payload_bytes, bool last_opener = true);

}  // namespace mlxj
