// The transport interface: a Link moves framed messages to and from one peer
// without blocking; the group's progress engine drives many links at once.
// TCP is the implementation today; shared memory plugs in behind the same API.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <poll.h>

#include "mlxj/dtype.h"
#include "mlxj/reduce.h"

namespace mlxj {

enum class OpCode : uint8_t { AllSum = 1, AllMax, AllMin, AllGather, SumScatter, Send, Barrier, Split };

// Every message starts with this header so that mismatched calls (another op,
// size, dtype, or a skipped collective) fail with a clear error, never corrupt data.
struct MsgHeader {
  uint16_t magic = 0x4d4a;  // "MJ"
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint32_t seq = 0;
  uint64_t nbytes = 0;
};
static_assert(sizeof(MsgHeader) == 16, "header is 16 bytes on the wire");

const char* op_name(uint8_t op);
// `receiving`: h is what a receiver expects (a point-to-point one is then named recv: the wire says send).
std::string describe(const MsgHeader& h, bool receiving = false);
// Throws CommError(Protocol) naming the peer and both calls when the headers differ.
void check_header(const MsgHeader& expected, const MsgHeader& got, const std::string& peer);
// Throw CommError(Peer) for a connection that failed with errno `err`, or that the peer closed.
[[noreturn]] void peer_lost(int err, const std::string& peer);
[[noreturn]] void peer_closed(const std::string& peer);

// Why a rank gave up on its group, as the peers learn it (TCP carries only this, shared memory the text too).
enum class GiveUp : uint8_t { Aborted = 0, TimedOut = 1, Interrupted = 2, Failed = 3 };
// Throws GaveUpError: `peer` gave up on the group, as `origin` (a world rank, -1 unknown) did
// first, because of `why`; `detail` is that rank's reason when it travelled (shared memory).
// A rank that gives up withdraws from the collective it was in, or from the next one when idle:
// no peer takes its data of that op.
[[noreturn]] void peer_gave_up(const std::string& peer, int origin, GiveUp why, const std::string& detail);

// What a receive does with its bytes as they arrive: out = mine op received
// (received op mine unless mine_first), element-wise. out may be the receive buffer.
struct Fold {
  uint8_t* out = nullptr;  // null: a plain receive
  const uint8_t* mine = nullptr;
  bool mine_first = true;
  Dtype t = Dtype::UInt8;
  ReduceOp op = ReduceOp::Sum;
};

class Link {
 public:
  virtual ~Link() = default;
  // "rank 1 (127.0.0.1:33324)": used in every error about this peer.
  virtual const std::string& name() const = 0;
  virtual void begin_send(const MsgHeader& h, const void* data, size_t size) = 0;
  // With a fold, a link that folds() reduces arriving data into fold->out
  // itself (data is then unused); other links only fill data.
  virtual void begin_recv(const MsgHeader& expect, void* data, size_t size, const Fold* fold) = 0;
  virtual bool sending() const = 0;
  virtual bool receiving() const = 0;
  // Moves what the OS takes now without blocking; true if any byte moved.
  // Throws CommError naming the peer on failure or a mismatched header.
  virtual bool progress() = 0;
  // Payload bytes received so far as one contiguous prefix.
  virtual size_t received() const = 0;
  // What to wait on for the pending work.
  virtual void wait_set(std::vector<pollfd>& out) const = 0;
  // Thread-safe, before shutdown(): tells the peer that this rank withdraws from collective
  // #`from` and every later op (its messages of earlier collectives stay good). The peer then
  // takes no message of ours of collective #from or later, and starts no send to us.
  virtual void withdraw(uint32_t from, GiveUp why, int origin, const std::string& reason) = 0;
  // Thread-safe: pending and later I/O fail; the peer sees the connection end.
  virtual void shutdown() = 0;
  // Frees what the link holds besides its sockets (shared memory). Only once no
  // op runs on it or ever will (its group is aborted); later ops on it fail.
  virtual void release() {}
  // "tcp" or "shm".
  virtual const char* kind() const = 0;
  // Called while an op waits on this link: throws CommError(Peer) once the peer's
  // host has stopped answering for the dead-peer timeout (a vanished host sends no FIN).
  virtual void check_alive(std::chrono::steady_clock::time_point) {}
  // Whether a short bounded spin beats sleeping right away.
  virtual bool spins() const { return false; }
  // Whether begin_recv's fold is applied by the link (as data arrives) rather than by the caller.
  virtual bool folds() const { return false; }
  // For an idle link while the group works elsewhere (the board): whether the
  // peer has closed its end (it exited or aborted), and the header of a message
  // that is waiting unasked, without consuming it.
  virtual bool peer_left() { return false; }
  virtual std::optional<MsgHeader> waiting_header() const { return std::nullopt; }
};

}  // namespace mlxj
