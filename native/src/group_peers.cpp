// The group's side facing its peers' acceptor-borne news: their queries about an op (timeout
// agreement) and a peer leaving the group to form a new world.
#include <algorithm>
#include <string>

#include "mlxj/group.h"

namespace mlxj {

void Group::watch_for_peers_leaving() {
  ctx_->on_superseded(id_, [weak = std::weak_ptr<Group>(shared_from_this())](const std::string& why) {
    if (auto g = weak.lock()) g->peer_left(why);
  });
  ctx_->on_query(id_, [weak = std::weak_ptr<Group>(shared_from_this())](uint32_t initiator, uint32_t kind,
                                                                         uint32_t index) {
    if (auto g = weak.lock()) return g->answer_query(initiator, kind, index);
    return QueryReply{};
  });
}

QueryReply Group::answer_query(uint32_t initiator, uint32_t kind, uint32_t index) {
  QueryReply r;
  PauseView pause = pause_state();
  r.paused = pause.now;
  r.since_pause_end_ms = pause.since_end_ns < 0 ? -1 : pause.since_end_ns / 1000000;
  int from = int(std::find(members_.begin(), members_.end(), int(initiator)) - members_.begin());
  uint32_t what = (kind >> 8) & 0xf;
  if (!formed_ || from == size() || from == me_ || what > uint32_t(QueryWhat::YourRecvs)) return r;
  bool idle = false;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(op_mu_);
    uint32_t entered = what == uint32_t(QueryWhat::Collective) ? entered_seq_
                       : what == uint32_t(QueryWhat::YourSends) ? sends_in_[size_t(from)]
                                                                : recvs_in_[size_t(from)];
    if (entered >= index) {
      r.answer = QueryAnswer::Entered;
      return r;
    }
    if (refused_ || aborted_) {
      r.answer = QueryAnswer::Refused;
      return r;
    }
    if (!(kind & kQueryRefuse)) {
      r.answer = QueryAnswer::NotEntered;
      return r;
    }
    // Refused: this rank never enters that op (nor any later one); an op in progress here
    // (an earlier one, which the peer may have completed) still may complete.
    uint32_t tenths = kind >> 16;
    std::string op = what == uint32_t(QueryWhat::Collective) ? "collective #" + std::to_string(index) + " of this group"
                     : what == uint32_t(QueryWhat::YourSends) ? "send #" + std::to_string(index) + " to it"
                                                              : "recv #" + std::to_string(index) + " from it";
    std::string after = tenths ? " after " + std::to_string(tenths / 10) + (tenths % 10 ? "." + std::to_string(tenths % 10) : "") + " s" : "";
    refused_why_ = ctx_->describe(int(initiator)) + " timed out" + after + " waiting for rank " + std::to_string(me_) +
                   " to enter " + op;
    refused_origin_ = int(initiator);
    refused_ = true;
    idle = !op_busy_;
    why = refused_why_;
  }
  if (idle) give_up(why, GiveUp::TimedOut, int(initiator));
  r.answer = QueryAnswer::Refused;
  return r;
}

void Group::give_up_if_left() {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(op_mu_);
    why = left_why_;
  }
  if (!why.empty()) give_up(why, GiveUp::Aborted);
}

void Group::peer_left(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(op_mu_);
    if (left_why_.empty()) left_why_ = why;
    if (op_busy_) return;  // the op's end gives up (unlock_op)
  }
  // Idle: an op entering from now on finds left_why_ (guarded) and fails; this gives up for the next one.
  give_up(why, GiveUp::Aborted);
}

}  // namespace mlxj
