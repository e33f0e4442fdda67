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
// Whether op k completes is decided by one word per slot set, its gate (op, count, given up):
// a post counts itself in, a rank that gives up sets the gate's flag, each by compare-and-swap
// on that one word. So either every post is counted first (the op completes on every rank,
// even one that gives up afterwards: its abort then takes the next op) or the flag is set
// first (every rank fails the op, including one that posts later). No timing decides it.
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
  // `world`: each rank's world rank (who gave up is named by it; empty: unknown).
  Board(std::shared_ptr<SharedSegment> seg, int me, std::vector<std::string> names, std::vector<int> world = {});
  const std::string& name(int r) const { return names_[size_t(r)]; }

  // Publishes this rank's contribution to op k (k = 1, 2, ...) and counts it in; throws
  // CommError naming the rank that gave up if op k was given up before.
  void post(uint64_t k, const MsgHeader& h, const void* data, size_t nbytes);
  // Whether every rank's post of op k is counted in; throws CommError if op k was given up.
  bool complete(uint64_t k) const;
  // This rank gives up op k (posted, not complete): false if it completed first.
  bool cancel(uint64_t k);
  // Whether rank r has posted op k; throws CommError naming it if its call differs from `expect`.
  bool posted(int r, uint64_t k, const MsgHeader& expect) const;
  // Rank r's data of op k (once posted() said so).
  const uint8_t* data(int r, uint64_t k) const;

  // Tells every rank that this one has given up on the group, and why, and gives up the
  // first op it has not seen complete (any thread).
  // `origin` and `why`: as GaveUpError's (errors.h).
  void mark_aborted(const std::string& reason, int origin, int why);
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
  // Throws naming who gave up op `gate` (a gate word with its flag set) and why.
  [[noreturn]] void gave_up(uint64_t gate) const;
  [[noreturn]] void corrupt_gate(uint64_t k, uint64_t gate) const;

  std::shared_ptr<SharedSegment> seg_;
  uint8_t* base_;
  int n_, me_;
  std::vector<std::string> names_;
  std::vector<int> world_;
  std::atomic<uint64_t> last_posted_{0};  // (this process's) the newest op this rank counted itself in
};

}  // namespace mlxj
