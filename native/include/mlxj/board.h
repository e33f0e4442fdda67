// The board: one shared-memory segment for all ranks of a group on one host,
// for small all-reduces and all-gathers in one step. Each rank posts its whole vector in its
// own slot and reads every other rank's slot; so a rank waits for each peer to
// have run once in the call, not for a chain of ring steps (which, with more
// ranks than cores, costs a scheduling round per step).
//
// Slots come in two sets used by turns (op k uses set k % 2): a rank can only
// post op k+2 once it has seen every post of op k+1, which each rank makes only
// after it has finished reading op k. So no slot is overwritten while read.
//
// Nothing read from the board is trusted: its sizes are this process's own,
// a slot's header is checked against this rank's call before its data is used,
// and a sequence number other than the expected ones fails as corruption.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mlxj/shm_segment.h"
#include "mlxj/transport.h"

namespace mlxj {

class Board {
 public:
  static constexpr size_t kSlotBytes = size_t(16) << 10;  // the largest vector a board op carries
  static constexpr int kMaxRanks = 256;                    // beyond this, 8 MiB of slots: use the ring
  // Bytes of segment a board of n ranks needs.
  static size_t bytes_for(int n);

  // `seg`'s payload holds at least bytes_for(n) bytes, zeroed by its creator's OS (every slot
  // empty); `me` is this rank's slot; `names` name every rank in errors ("rank 1 (127.0.0.1:5001)").
  Board(std::shared_ptr<SharedSegment> seg, int me, std::vector<std::string> names);
  const std::string& name(int r) const { return names_[size_t(r)]; }

  // Publishes this rank's contribution to op k (k = 1, 2, ...).
  void post(uint64_t k, const MsgHeader& h, const void* data, size_t nbytes);
  // Whether rank r has posted op k; throws CommError naming it if its call differs from `expect`.
  bool posted(int r, uint64_t k, const MsgHeader& expect) const;
  // Rank r's data of op k (once posted() said so).
  const uint8_t* data(int r, uint64_t k) const;

  // Tells every rank that this one has given up on the group, and why.
  void mark_aborted(const std::string& reason);
  // 1 + the rank that aborted first, or 0; its reason, made printable.
  int aborted_by() const;
  std::string abort_reason() const;

  // Sleeps until a post or an abort changes the board, or for at most `micros`.
  // `seen` is posts() as read before the last look at the slots (no lost wake-up).
  uint32_t posts() const;
  void sleep(uint32_t seen, int64_t micros);

 private:
  struct Slot;
  struct Header;
  Slot& slot(int r, uint64_t k) const;
  Header& header() const;

  std::shared_ptr<SharedSegment> seg_;
  uint8_t* base_;
  int n_, me_;
  std::vector<std::string> names_;
};

}  // namespace mlxj
