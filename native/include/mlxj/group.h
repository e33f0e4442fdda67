// A communication group: rank, size, split, abort, and the collectives.
// Ops on one group run one at a time: an op from a second thread waits for the
// op lock, and that wait is bounded by its own deadline, abort and Ctrl-C (an op
// that gives up there never started: the group is left as it is). abort() may be
// called from any thread and fails pending and later ops at once.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mlxj/activity.h"
#include "mlxj/board.h"
#include "mlxj/context.h"
#include "mlxj/dtype.h"
#include "mlxj/errors.h"
#include "mlxj/options.h"
#include "mlxj/reduce.h"
#include "mlxj/transport.h"

namespace mlxj {

// How long one call may block and how it notices Ctrl-C; timeout < 0 = no limit.
struct CallOptions {
  double timeout = -1;
  InterruptCheck interrupted;
};

class Group : public std::enable_shared_from_this<Group> {
 public:
  // The world group: connects the ring (rank i -> rank i+1 on every address of i+1).
  static std::shared_ptr<Group> world(int rank, std::vector<std::vector<Endpoint>> addresses,
                                      const CoreOptions& options, const CallOptions& opts);
  ~Group();

  int rank() const { return me_; }
  int size() const { return int(members_.size()); }
  int world_rank(int r) const { return members_[r]; }
  // The same on every rank of the group (the world is 1; a split's is derived from it).
  uint64_t id() const { return id_; }
  // What the group does now, from any thread, without locks (activity.h).
  ActivityView activity() const { return activity_.read(); }
  // This group's records of the current profile, oldest first (see activity.h); empties them.
  std::vector<ProfileRecord> take_profile(uint64_t* dropped) { return profile_.take(dropped); }

  // `options`, if given, are the new group's (every rank must give the same); by default this
  // group's. Connections keep the world's token, verbosity and dead-peer timeout.
  std::shared_ptr<Group> split(int color, int key, const CallOptions& opts, const CoreOptions* options = nullptr);
  const CoreOptions& options() const { return opts_; }
  void barrier(const CallOptions& opts);
  // Gives up on the group: this rank withdraws from the collective it is in (or, idle, from the
  // next one), so that no peer completes that op with our data, and fails pending and later ops.
  void abort(const std::string& reason) { give_up(reason, GiveUp::Aborted); }
  // Aborts and releases the process's listening ports (for every group of this world).
  void close(const std::string& reason);
  bool aborted() const { return aborted_.load(); }
  std::string abort_reason() const;
  // The transport of each link, e.g. "right:shm", "left:tcp", "rank 3:tcp".
  std::vector<std::string> link_kinds() const;

  // out may alias in. count = elements.
  void all_reduce(const void* in, void* out, size_t count, Dtype t, ReduceOp op, const CallOptions& opts);
  // out holds size() * nbytes.
  void all_gather(const void* in, void* out, size_t nbytes, Dtype t, const CallOptions& opts);
  // in holds size() * count elements; out receives this rank's count.
  void reduce_scatter(const void* in, void* out, size_t count, Dtype t, ReduceOp op, const CallOptions& opts);
  void send(const void* data, size_t nbytes, Dtype t, int dst, const CallOptions& opts);
  void recv(void* data, size_t nbytes, Dtype t, int src, const CallOptions& opts);

 private:
  Group(std::shared_ptr<Context> ctx, uint64_t id, std::vector<int> members, CoreOptions options);
  void watch_for_peers_leaving();
  // A peer left this group to form a new one (it dials us with a key we consumed): the group is over
  // from the next op on, but an op in progress here goes on, decided by its links and board like any
  // op a peer left after (the peer may have completed it: failing it here would diverge).
  void peer_left(const std::string& why);
  void give_up_if_left();  // (not under op_mu_) gives up if a peer left: at an op's start and end
  void connect_ring(const Wait& wait);
  Link& p2p_link(int peer, bool sending, const Wait& wait);
  // A send/recv peer: throws std::invalid_argument (ValueError) unless it is another rank of this group.
  void check_peer(int peer, const char* what) const;
  Wait make_wait(const CallOptions& opts, const std::string& what);
  // `origin`: the world rank where the give-up started (-1: this one).
  void give_up(const std::string& reason, GiveUp why, int origin = -1);
  // The collective this rank withdraws from now (the one in progress, else the next); marks the
  // group withdrawn, so that an op finishing meanwhile fails instead of completing (see guarded).
  uint32_t withdraw_point() { return open_.fetch_or(kWithdrawn) & ~kWithdrawn; }
  static constexpr uint32_t kWithdrawn = uint32_t(1) << 31;
  // Marks the current collective complete here; false if this rank withdrew from it first
  // (abort() from another thread: the peers may refuse our data of it).
  bool complete_collective() {
    uint32_t open = open_.load(std::memory_order_relaxed);
    while (!(open & kWithdrawn))
      if (open_.compare_exchange_weak(open, seq_ + 1)) return true;
    return (open & ~kWithdrawn) > seq_;  // withdrawn from a later one: this one was complete
  }
  std::string describe(int r) const { return ctx_->describe(members_[r]); }

  // One send or receive of a step.
  struct Xfer {
    Link* link = nullptr;
    bool send = false;
    MsgHeader header;
    uint8_t* data = nullptr;
    size_t size = 0;
    Fold fold;
    size_t seen = 0;  // bytes already folded
  };
  // The transfers of one step: at most a send and a receive on each of two links.
  // Fixed capacity, so that a step allocates nothing.
  struct Step {
    Xfer xs[4];
    size_t n = 0;
    Xfer& add(Link* link, bool send, const MsgHeader& h, const void* data, size_t size) {
      Xfer& x = xs[n++];
      x.link = link;
      x.send = send;
      x.header = h;
      x.data = static_cast<uint8_t*>(const_cast<void*>(data));
      x.size = size;
      return x;
    }
  };
  // Drives the transfers of one step to completion without blocking the CPU.
  void run(Step& step, const Wait& wait);
  // Throws if the group was aborted, Ctrl-C is pending or the deadline has passed.
  void check_stop(Link* const* links, size_t nlinks, bool moving, const Wait& wait, Clock::time_point now);
  // The timeout of an op that still waits for `who` (ranks, comma-separated).
  [[noreturn]] static void timed_out(const Wait& wait, const std::string& who);
  struct OpStart;
  // Waits for the op lock within the op's deadline; abort and Ctrl-C end the wait. Taking it, the
  // op has entered (see answer_query); a group that refused to enter it gives up and throws.
  // Throws (Timeout, Aborted, Interrupted, a peer's give-up) without touching the group otherwise.
  void lock_op(const Wait& wait, const OpStart& start);
  void unlock_op();
  struct OpLock {
    Group& g;
    ~OpLock() { g.unlock_op(); }
  };
  // What an op is, for its activity and profile record; a collective takes the next number of the group.
  struct OpStart {
    OpKind kind;
    uint64_t nbytes = 0;
    Dtype dtype = Dtype::UInt8;
    bool collective = true;
    int peer = -1;  // send/recv: the other rank
  };
  // Under the op lock: the op's activity from begin to end, and its profile record (when profiling).
  struct OpScope {
    Group& g;
    bool ok = false;
    OpScope(Group& group, const OpStart& start, double timeout);
    ~OpScope();
  };
  // Runs one op under the op lock; any failure in the op aborts the group, then propagates.
  template <typename Body>
  void guarded(const CallOptions& opts, const std::string& what, const OpStart& start, Body&& body) {
    Wait wait = make_wait(opts, what);
    lock_op(wait, start);
    OpLock held{*this};
    give_up_if_left();  // (the op then fails at once: the peer that left never enters it)
    OpScope scope(*this, start, opts.timeout);
    try {
      wait.check_abort();
      body(static_cast<const Wait&>(wait));
      // A collective completes here only if this rank did not withdraw from it meanwhile
      // (abort() from another thread): its peers may have refused our data already.
      if (start.collective && !complete_collective())
        fail(ErrorKind::Aborted, "the group was aborted during " + what + ": " + abort_reason() +
                                     " (call init() again on every rank to form a new group)");
      scope.ok = true;
    } catch (const Interrupted&) {
      give_up("interrupted (Ctrl-C) during " + what + " on rank " + std::to_string(me_), GiveUp::Interrupted);
      release_links();
      throw;
    } catch (const CommError& e) {
      failed(what, e);
      release_links();
      throw;
    }
  }
  void failed(const std::string& what, const CommError& e);
  // Timeout agreement. At its deadline an op asks the ranks it waits for (every other rank for a
  // collective, the peer for send/recv) whether they have entered it: true if it must time out
  // now (a rank refused to enter it: it then completes on no rank); false if it goes on, its
  // deadline moved past a peer's pause (a debugger: the timeout counts from the pause's end) or
  // lifted (every rank has entered: it completes everywhere, bounded by dead-peer detection).
  // `board`: the board's gate decides entry; only pauses are asked about.
  bool must_time_out(const Wait& wait, bool board = false);
  // A peer's query (the acceptor thread; context.h).
  QueryReply answer_query(uint32_t initiator, uint32_t kind, uint32_t index);
  // After a failure (the group is aborted for good; we hold the op lock): frees the links' shared memory.
  void release_links();

  struct RingDir {
    Link* to;
    Link* from;
    int pos;
  };
  RingDir ring_dir(bool right) const;
  void ring_reduce_scatter_step(int step, size_t count, Dtype t, ReduceOp op, const uint8_t* src, uint8_t* buf,
                                MsgHeader h, bool sum_scatter_layout, const Wait& wait);
  void ring_all_gather_step(int step, size_t count, Dtype t, uint8_t* buf, MsgHeader h,
                            bool sum_scatter_layout, const Wait& wait);
  void pair_all_reduce(const void* in, void* out, size_t count, Dtype t, ReduceOp op, MsgHeader h, const Wait& wait);
  void small_all_reduce(const void* in, void* out, size_t count, Dtype t, ReduceOp op, MsgHeader h, const Wait& wait);
  void gather_ring(const void* in, void* out, size_t nbytes, MsgHeader h, const Wait& wait);
  // The board (group_board.cpp): whether this small op goes through it, joining it on first use.
  bool board_ready(size_t nbytes, const MsgHeader& h, const Wait& wait);
  void join_board(const MsgHeader& h, const Wait& wait);
  void board_all_reduce(const void* in, void* out, size_t count, Dtype t, ReduceOp op, const MsgHeader& h,
                        const Wait& wait);
  void board_all_gather(const void* in, void* out, size_t nbytes, const MsgHeader& h, const Wait& wait);
  uint64_t board_exchange(const void* in, size_t nbytes, const MsgHeader& h, const Wait& wait);
  void wait_board(uint64_t k, const MsgHeader& h, const Wait& wait);
  void check_board(int first_missing, uint64_t k, const MsgHeader& h, const Wait& wait, Clock::time_point now);
  MsgHeader header(OpCode op, Dtype t, size_t nbytes);
  // Scratch memory kept across ops (ops on a group are serialised), so large
  // ops do not pay for fresh pages every time.
  enum class Slot { DirRight, DirLeft, Gather, Peer, Work, Count };
  uint8_t* scratch(Slot slot, size_t bytes);

  std::shared_ptr<Context> ctx_;
  CoreOptions opts_;  // links, board and algorithm choices of this group
  uint64_t id_;
  std::vector<int> members_;  // world ranks, in group rank order
  int me_ = 0;
  std::unique_ptr<Link> right_, left_;  // right_: we opened it to rank+1; left_: rank-1 opened it to us
  std::map<int, std::unique_ptr<Link>> p2p_;
  // Decided once, by all ranks together (so all take the same path): board_ holds the board if they took it.
  bool board_decided_ = false;
  std::unique_ptr<Board> board_;  // set and freed under abort_mu_ (abort() marks it from any thread)
  uint64_t board_ops_ = 0;
  bool board_hot_spin_ = true;  // whether a board wait starts with a hot spin (not with more ranks than cores)
  // The op lock (see lock_op): op_busy_ under op_mu_; op_free_ is notified when it is released
  // or the group aborted. Never taken while holding abort_mu_.
  std::mutex op_mu_;
  std::condition_variable op_free_;
  bool op_busy_ = false;
  // Entry (under op_mu_): the newest collective entered, and send/recv entered per peer; after a
  // refusal (a peer timed out before we entered), no op enters: refused_why_ says why.
  uint32_t entered_seq_ = 0;
  std::vector<uint32_t> sends_in_, recvs_in_;
  bool refused_ = false;
  std::string refused_why_;
  std::string left_why_;  // a peer left the group during an op (peer_left): given up once the op ends
  int refused_origin_ = -1;
  uint32_t op_entry_ = 0;  // this op's number as the query names it (collective #, or send/recv count)
  bool op_full_ = false;   // every rank has entered this op: its deadline no longer applies
  int op_refused_by_ = -1;  // the group rank whose refusal timed this op out (must_time_out)
  // Its ring is connected: only then does it answer queries (a query about a group still forming
  // comes from a rank of an earlier world of the same id, which this one must not refuse for it).
  std::atomic<bool> formed_{false};
  mutable std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  int give_up_origin_ = -1;  // (under abort_mu_) what abort_reason_ came from, for links made later
  GiveUp give_up_why_ = GiveUp::Aborted;
  Waker abort_waker_;
  struct Block {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
  };
  Block scratch_[int(Slot::Count)];
  uint32_t seq_ = 0;
  // The first collective not completed here (it follows seq_ between ops), | kWithdrawn once given up.
  std::atomic<uint32_t> open_{1};
  uint32_t splits_ = 0;
  // The op in progress (written under the op lock): see OpScope and run().
  Activity activity_;
  ProfileRing profile_;
  OpStart op_{OpKind::None};
  uint64_t op_seq_ = 0, op_moved_ = 0, p2p_ops_ = 0;
  int64_t op_start_ns_ = 0, op_wait_ns_ = 0;
  int32_t op_waited_on_ = -1;
  // The group rank at the other end of `link` (one of ours), or -1.
  int peer_of(const Link* link) const;
};

}  // namespace mlxj
