// Group lifecycle, connections, the op lock, abort and p2p (the progress engine: group_progress.cpp).
#include "mlxj/group.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "mlxj/errors.h"
#include "mlxj/link_setup.h"
#include "mlxj/spin.h"  // kBusyCheck

namespace mlxj {

namespace {

constexpr double kNoDeadline = 1e9;  // seconds

}  // namespace

Group::Group(std::shared_ptr<Context> ctx, uint64_t id, std::vector<int> members, CoreOptions options)
    : ctx_(std::move(ctx)), opts_(std::move(options)), id_(id), members_(std::move(members)) {
  me_ = int(std::find(members_.begin(), members_.end(), ctx_->rank()) - members_.begin());
  sends_in_.assign(members_.size(), 0);
  recvs_in_.assign(members_.size(), 0);
}

Group::~Group() = default;

std::shared_ptr<Group> Group::world(int rank, std::vector<std::vector<Endpoint>> addresses,
                                    const CoreOptions& options, const CallOptions& opts) {
  int n = int(addresses.size());
  auto ctx = std::make_shared<Context>(rank, std::move(addresses), options);
  std::vector<int> members(n);
  for (int i = 0; i < n; ++i) members[i] = i;
  std::shared_ptr<Group> g(new Group(ctx, 1, members, options));
  g->watch_for_peers_leaving();
  g->guarded(opts, "init", {OpKind::Init, 0, Dtype::UInt8, false}, [&](const Wait& wait) { g->connect_ring(wait); });
  return g;
}

bool Group::must_time_out(const Wait& wait, bool board) {
  if (op_full_) {
    wait.deadline = Clock::time_point::max();
    return false;
  }
  uint32_t what;
  std::vector<int> peers;
  if (op_.collective) {
    what = uint32_t(QueryWhat::Collective);
    for (int r = 0; r < size(); ++r)
      if (r != me_) peers.push_back(r);
  } else if (op_.kind == OpKind::Send || op_.kind == OpKind::Recv) {
    what = uint32_t(op_.kind == OpKind::Send ? QueryWhat::YourRecvs : QueryWhat::YourSends);
    peers.push_back(op_.peer);
  } else {
    return true;  // init: there is no op to agree on yet
  }
  uint32_t tenths = wait.seconds > 0 ? uint32_t(std::min(wait.seconds * 10 + 0.5, 65535.0)) : 0;
  auto bound = std::min<Clock::duration>(ctx_->options().dead_peer(), std::chrono::seconds(5));
  auto ask = [&](int r, bool refuse) {
    ConnKey key{id_, uint32_t(members_[me_]),
                uint32_t(ConnKind::Query) | what << 8 | (refuse ? kQueryRefuse : 0) | tenths << 16, op_entry_};
    return ctx_->query(members_[r], key, Clock::now() + bound, wait);
  };
  std::vector<QueryReply> replies;
  for (int r : peers) replies.push_back(ask(r, false));
  // A peer's pause (a debugger's prompt) stops the clock: the timeout counts from its end.
  auto now = Clock::now();
  auto grace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(wait.seconds, 0.0)));
  Clock::time_point later = wait.deadline;
  for (const auto& q : replies) {
    if (q.paused) later = std::max(later, now + std::max<Clock::duration>(grace, std::chrono::seconds(1)));  // (asks at most once a second)
    else if (q.since_pause_end_ms >= 0) later = std::max(later, now - std::chrono::milliseconds(q.since_pause_end_ms) + grace);
  }
  if (later > now) {
    wait.deadline = later;
    return false;
  }
  if (board) return true;  // the board's gate decides the rest
  bool unknown = false;
  for (size_t i = 0; i < peers.size(); ++i) {
    QueryAnswer a = replies[i].answer;
    if (a == QueryAnswer::NotEntered) a = ask(peers[i], true).answer;
    if (a == QueryAnswer::Refused) {
      op_refused_by_ = peers[i];
      return true;
    }
    unknown |= a == QueryAnswer::Unknown;
  }
  // A rank that could not be reached (it left the world, its host vanished, it is forming a new
  // world) may have completed the op: ask again a little later; meanwhile its links tell whether
  // its data still come (a rank that left closed them, a vanished host fails dead-peer detection).
  if (unknown) {
    wait.deadline = Clock::now() + std::clamp<Clock::duration>(grace, std::chrono::milliseconds(100), std::chrono::seconds(1));
    return false;
  }
  // Every rank has entered the op: no rank may time out of it any more, for another rank may
  // have completed it already.
  op_full_ = true;
  wait.deadline = Clock::time_point::max();
  return false;
}

void Group::connect_ring(const Wait& wait) {
  int n = size();
  if (n == 1) return;
  int succ = members_[(me_ + 1) % n], pred = members_[(me_ + n - 1) % n], self = members_[me_];
  std::vector<Fd> out, in;
  for (size_t i = 0; i < ctx_->addresses(succ).size(); ++i)
    out.push_back(ctx_->connect(succ, i, ConnKey{id_, uint32_t(self), uint32_t(ConnKind::Ring), uint32_t(i)}, wait));
  for (size_t i = 0; i < ctx_->addresses(self).size(); ++i)
    in.push_back(ctx_->accept(ConnKey{id_, uint32_t(pred), uint32_t(ConnKind::Ring), uint32_t(i)}, pred, wait));
  // Each setup is a request and reply: even ranks answer their successor first,
  // odd ranks their predecessor, so no cycle of ranks waits on itself.
  bool right_first = me_ % 2 == 0;
  std::unique_ptr<Link> right, left;
  if (right_first) right = establish_link(std::move(out), true, ctx_->describe(succ), wait, opts_);
  left = establish_link(std::move(in), false, ctx_->describe(pred), wait, opts_);
  if (!right_first) right = establish_link(std::move(out), true, ctx_->describe(succ), wait, opts_);
  // abort() may run now in another thread (a peer-left hook, the user): hand the links over under its lock.
  std::lock_guard<std::mutex> lock(abort_mu_);
  right_ = std::move(right);
  left_ = std::move(left);
  formed_ = true;
  if (aborted_) {
    uint32_t from = open_.load() & ~kWithdrawn;
    right_->withdraw(from, give_up_why_, give_up_origin_, abort_reason_);
    left_->withdraw(from, give_up_why_, give_up_origin_, abort_reason_);
    right_->shutdown();
    left_->shutdown();
  }
}

Link& Group::p2p_link(int peer, bool sending, const Wait& wait) {
  int n = size();
  if (peer < 0 || peer >= n || peer == me_)
    fail(ErrorKind::Config, std::string(sending ? "send to" : "recv from") + " rank " + std::to_string(peer) +
                                ": ranks of this group are 0.." + std::to_string(n - 1) + " other than " + std::to_string(me_));
  int right = (me_ + 1) % n, left = (me_ + n - 1) % n;
  // Ring neighbours reuse the ring connections; the sender's right link is the receiver's left one.
  if (sending ? peer == right : peer == left) return sending ? *right_ : *left_;
  if (sending ? peer == left : peer == right) return sending ? *left_ : *right_;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    auto it = p2p_.find(peer);
    if (it != p2p_.end()) return *it->second;
  }
  // Other pairs: the lower rank opens a direct connection to the higher's first address.
  int lo = std::min(me_, peer), w_lo = members_[lo], w_peer = members_[peer];
  ConnKey key{id_, uint32_t(w_lo), uint32_t(ConnKind::P2P), 0};
  std::vector<Fd> conns;
  conns.push_back(me_ == lo ? ctx_->connect(w_peer, 0, key, wait) : ctx_->accept(key, w_peer, wait));
  auto fresh = establish_link(std::move(conns), me_ == lo, ctx_->describe(w_peer), wait, opts_);
  std::lock_guard<std::mutex> lock(abort_mu_);
  auto& link = p2p_[peer] = std::move(fresh);
  if (aborted_) {
    link->withdraw(open_.load() & ~kWithdrawn, give_up_why_, give_up_origin_, abort_reason_);
    link->shutdown();
  }
  return *link;
}

std::string Group::abort_reason() const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  return abort_reason_;
}

void Group::give_up(const std::string& reason, GiveUp why, int origin) {
  if (origin < 0) origin = members_[me_];
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!aborted_) {
      abort_reason_ = reason;
      aborted_ = true;  // (before the withdrawal: an op that sees it withdrawn then finds the group aborted)
      // First the withdrawal (the peers then take none of our data of that op, early or late),
      // then shutdown() (not close: safe while another thread polls these sockets), which
      // the peers see at once.
      uint32_t from = withdraw_point();
      if (right_) right_->withdraw(from, why, origin, reason);
      if (left_) left_->withdraw(from, why, origin, reason);
      for (auto& [_, link] : p2p_) link->withdraw(from, why, origin, reason);
      give_up_origin_ = origin;
      give_up_why_ = why;
      if (board_) board_->mark_aborted(abort_reason_, origin, int(why));  // ranks waiting on the board learn it there
    }
    aborted_ = true;
    if (right_) right_->shutdown();
    if (left_) left_->shutdown();
    for (auto& [_, link] : p2p_) link->shutdown();
    abort_waker_.wake();
  }
  // Ops of other threads waiting for the op lock learn it now. op_mu_ is taken (after abort_mu_
  // is released: lock_op checks the abort outside op_mu_) so that no waiter misses the notice.
  { std::lock_guard<std::mutex> lock(op_mu_); }
  op_free_.notify_all();
}

void Group::lock_op(const Wait& wait, const OpStart& start) {
  // Under op_mu_: takes the lock and enters the op (a peer's query then finds it entered), unless
  // this rank refused to enter it (false).
  auto enter = [&] {
    if (refused_) return false;
    op_busy_ = true;
    if (aborted_) return true;  // (it fails under the lock, and frees the links)
    if (start.collective) op_entry_ = entered_seq_ = seq_ + 1;
    else if (start.kind == OpKind::Send) op_entry_ = ++sends_in_[size_t(start.peer)];
    else if (start.kind == OpKind::Recv) op_entry_ = ++recvs_in_[size_t(start.peer)];
    return true;
  };
  auto refused = [&] {
    std::string why;
    int origin;
    {
      std::lock_guard<std::mutex> lock(op_mu_);
      why = refused_why_;
      origin = refused_origin_;
    }
    give_up(why, GiveUp::TimedOut, origin);  // (done already if it came while idle)
    std::string asker = ctx_->describe(origin) + " timed out ";
    peer_gave_up(ctx_->describe(origin), origin, GiveUp::TimedOut, why.rfind(asker, 0) == 0 ? why.substr(asker.size()) : why);
  };
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(op_mu_);
      if (refused_) {
        lock.unlock();
        refused();
      }
      if (!op_busy_) {
        if (enter()) return;
        lock.unlock();
        refused();
      }
      if (!aborted_) {  // another thread's op runs: wait for it, looking at Ctrl-C every kBusyCheck
        auto until = std::min(wait.deadline, Clock::now() + kBusyCheck);
        op_free_.wait_until(lock, until, [this] { return !op_busy_ || aborted_; });
        if (!op_busy_) {
          if (enter()) return;
          lock.unlock();
          refused();
        }
      }
    }
    wait.check_abort();
    if (wait.interrupted && wait.interrupted()) throw Interrupted();
    if (Clock::now() >= wait.deadline)
      fail(ErrorKind::Timeout, wait.what + " timed out waiting for another thread's operation on this group "
                                           "(a group runs one operation at a time; it did not start)");
  }
}

void Group::unlock_op() {
  {
    std::lock_guard<std::mutex> lock(op_mu_);
    op_busy_ = false;
  }
  try {
    give_up_if_left();  // (runs in OpLock's destructor: nothing may escape)
  } catch (...) {
  }
  op_free_.notify_one();
}

Group::OpScope::OpScope(Group& group, const OpStart& start, double timeout) : g(group) {
  if (start.collective) ++g.seq_;
  g.op_ = start;
  g.op_full_ = false;
  g.op_refused_by_ = -1;
  g.op_seq_ = start.collective ? g.seq_ : start.kind == OpKind::Init ? 0 : ++g.p2p_ops_;
  g.op_moved_ = 0;
  g.op_wait_ns_ = 0;
  g.op_waited_on_ = -1;
  g.op_start_ns_ = steady_ns();
  bool bounded = timeout >= 0 && timeout < kNoDeadline;  // as make_wait's deadline
  g.activity_.begin(start.kind, g.op_seq_, start.nbytes, start.dtype, g.op_start_ns_,
                    bounded ? int64_t(timeout * 1e6) : -1);
}

Group::OpScope::~OpScope() {
  g.activity_.end();
  if (!profiling()) return;  // the one branch the op pays when no profile is recorded
  ProfileRecord r;
  r.start_ns = g.op_start_ns_;
  r.end_ns = steady_ns();
  r.wait_ns = g.op_wait_ns_;
  r.seq = g.op_seq_;
  r.nbytes = g.op_.nbytes;
  r.waited_on = g.op_waited_on_;
  r.op = g.op_.kind;
  r.dtype = g.op_.dtype;
  r.ok = ok;
  try {
    g.profile_.add(r);
  } catch (...) {  // (a failed mutex lock) a destructor must not throw: the record is lost
  }
}

int Group::peer_of(const Link* link) const {
  int n = size();
  if (link == right_.get()) return (me_ + 1) % n;
  if (link == left_.get()) return (me_ + n - 1) % n;
  for (const auto& [peer, l] : p2p_)  // (only this op's thread adds to p2p_)
    if (l.get() == link) return peer;
  return -1;
}

void Group::close(const std::string& reason) {
  abort(reason);
  ctx_->close();
}

std::string Wait::timed_out() const {
  if (seconds < 0 || seconds >= kNoDeadline) return what + " timed out";
  std::ostringstream s;
  s << what << " timed out after " << seconds << " s";
  return s.str();
}

Wait Group::make_wait(const CallOptions& opts, const std::string& what) {
  Wait w;
  w.seconds = opts.timeout;
  // Infinite or huge (past ~30 years, where the clock arithmetic would overflow) means no deadline.
  if (opts.timeout >= 0 && opts.timeout < kNoDeadline)
    w.deadline = Clock::now() + std::chrono::microseconds(int64_t(opts.timeout * 1e6));
  w.interrupted = opts.interrupted;
  w.abort = &abort_waker_;
  w.check_abort = [this] {
    if (aborted_) fail(ErrorKind::Aborted, "the group was aborted: " + abort_reason() +
                                               " (call init() again on every rank to form a new group)");
  };
  w.what = what;
  return w;
}

void Group::failed(const std::string& what, const CommError& e) {
  if (e.kind() == ErrorKind::Aborted) return;
  std::string reason = what + " failed on rank " + std::to_string(me_) + ": " + e.what();
  if (auto* peer = dynamic_cast<const GaveUpError*>(&e))  // a peer's give-up: pass its origin on
    return give_up(reason, GiveUp(peer->why & 3), peer->origin);
  give_up(reason, e.kind() == ErrorKind::Timeout ? GiveUp::TimedOut : GiveUp::Failed);
}

void Group::release_links() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (right_) right_->release();
  if (left_) left_->release();
  for (auto& [_, link] : p2p_) link->release();
  board_.reset();
}

std::vector<std::string> Group::link_kinds() const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  std::vector<std::string> kinds;
  if (right_) kinds.push_back(std::string("right:") + right_->kind());
  if (left_) kinds.push_back(std::string("left:") + left_->kind());
  for (auto& [peer, link] : p2p_) kinds.push_back("rank " + std::to_string(peer) + ":" + link->kind());
  if (board_) kinds.push_back("board:shm");
  return kinds;
}

uint8_t* Group::scratch(Slot slot, size_t bytes) {
  Block& b = scratch_[int(slot)];
  if (b.size < bytes || !b.data) {
    b.data.reset();
    try {
      b.data.reset(new uint8_t[bytes ? bytes : 1]);
    } catch (const std::bad_alloc&) {
      b.size = 0;
      fail(ErrorKind::Config, "Unable to allocate " + std::to_string(bytes) + " bytes of scratch memory");
    }
    b.size = bytes;
  }
  return b.data.get();
}

MsgHeader Group::header(OpCode op, Dtype t, size_t nbytes) {
  MsgHeader h;
  h.op = uint8_t(op);
  h.dtype = uint8_t(t);
  h.seq = seq_;
  h.nbytes = nbytes;
  return h;
}

void Group::check_peer(int peer, const char* what) const {
  int n = size();
  if (peer < 0 || peer >= n || peer == me_)
    throw std::invalid_argument(std::string(what) + " rank " + std::to_string(peer) + ": ranks of this group are 0.." +
                                std::to_string(n - 1) + " other than " + std::to_string(me_) + " (this rank)");
}

void Group::send(const void* data, size_t nbytes, Dtype t, int dst, const CallOptions& opts) {
  check_peer(dst, "send to");  // an argument error leaves the group as it is (nothing was sent)
  guarded(opts, "send to rank " + std::to_string(dst), {OpKind::Send, nbytes, t, false, dst}, [&](const Wait& wait) {
    Step step;
    step.add(&p2p_link(dst, true, wait), true, header(OpCode::Send, t, nbytes), data, nbytes).header.seq = 0;
    run(step, wait);
  });
}

void Group::recv(void* data, size_t nbytes, Dtype t, int src, const CallOptions& opts) {
  check_peer(src, "recv from");
  guarded(opts, "recv from rank " + std::to_string(src), {OpKind::Recv, nbytes, t, false, src}, [&](const Wait& wait) {
    Step step;
    step.add(&p2p_link(src, false, wait), false, header(OpCode::Send, t, nbytes), data, nbytes).header.seq = 0;
    run(step, wait);
  });
}

void Group::barrier(const CallOptions& opts) {
  guarded(opts, "barrier", {OpKind::Barrier}, [&](const Wait& wait) {
    if (size() == 1) return;
    MsgHeader h = header(OpCode::Barrier, Dtype::UInt8, 0);
    if (board_ready(0, h, wait)) return board_all_reduce(nullptr, nullptr, 0, Dtype::UInt8, ReduceOp::Sum, h, wait);
    gather_ring(nullptr, nullptr, 0, h, wait);
  });
}

}  // namespace mlxj
