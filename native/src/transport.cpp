// What every transport shares: message headers and the errors about peers.
#include "mlxj/transport.h"

#include <cerrno>

#include "mlxj/dtype.h"
#include "mlxj/errors.h"
#include "mlxj/socket.h"

namespace mlxj {

const char* op_name(uint8_t op) {
  switch (static_cast<OpCode>(op)) {
    case OpCode::AllSum: return "all_sum";
    case OpCode::AllMax: return "all_max";
    case OpCode::AllMin: return "all_min";
    case OpCode::AllGather: return "all_gather";
    case OpCode::SumScatter: return "sum_scatter";
    case OpCode::Send: return "send";
    case OpCode::Barrier: return "barrier";
    case OpCode::Split: return "split";
  }
  return "unknown op";
}

std::string describe(const MsgHeader& h, bool receiving) {
  std::string s = receiving && h.op == uint8_t(OpCode::Send) ? "recv" : op_name(h.op);
  s += " of " + std::to_string(h.nbytes) + " bytes";
  if (h.dtype < 14) s += std::string(" (") + dtype_name(static_cast<Dtype>(h.dtype)) + ")";
  if (h.op != uint8_t(OpCode::Send)) s += ", collective #" + std::to_string(h.seq);
  return s;
}

void check_header(const MsgHeader& expected, const MsgHeader& got, const std::string& peer) {
  if (got.magic != expected.magic)
    fail(ErrorKind::Protocol, "garbled data from " + peer + " (bad message header): the streams are out of step");
  if (got.op != expected.op || got.nbytes != expected.nbytes || got.dtype != expected.dtype || got.seq != expected.seq)
    fail(ErrorKind::Protocol, peer + " sent " + describe(got) + " but this rank called " + describe(expected, true) +
                                  ": every rank must call the same operations in the same order with the same shapes and dtypes");
}

void peer_lost(int err, const std::string& peer) {
  if (err == ETIMEDOUT) fail(ErrorKind::Peer, peer + " stopped responding (its host is down or the network is cut)");
  fail(ErrorKind::Peer, "connection to " + peer + " was lost: " + errno_text(err));
}

void peer_gave_up(const std::string& peer, int origin, GiveUp why, const std::string& detail) {
  const char* verb = why == GiveUp::TimedOut      ? "timed out"
                     : why == GiveUp::Interrupted ? "was interrupted (Ctrl-C)"
                     : why == GiveUp::Failed      ? "had an operation fail"
                                                  : "aborted its group";
  std::string cause = (origin >= 0 ? "rank " + std::to_string(origin) : std::string("a rank")) + " " + verb;
  throw GaveUpError(peer + " gave up on this group (" + cause + (detail.empty() ? "" : ": " + detail) +
                        "): this operation cannot complete on any rank (call init() again on every rank)",
                    origin, int(why));
}

void peer_closed(const std::string& peer) {
  fail(ErrorKind::Peer, "connection to " + peer + " was closed by the peer (it exited, was interrupted or aborted its group)");
}

}  // namespace mlxj
