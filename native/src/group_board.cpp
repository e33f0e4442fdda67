// The group's use of the board (board.h): joining it, and all-reduces and all-gathers of up
// to Board::kSlotBytes per rank (and barriers) in one step when every rank of the group is on one host.
#include <algorithm>
#include <cstring>
#include <unistd.h>

#include "mlxj/errors.h"
#include "mlxj/group.h"
#include "mlxj/spin.h"
#include "mlxj/wire.h"

namespace mlxj {

namespace {

bool all_set(const std::vector<uint8_t>& flags, size_t stride) {
  for (size_t i = 0; i < flags.size(); i += stride)
    if (flags[i] != 1) return false;
  return true;
}

}  // namespace

bool Group::board_ready(size_t nbytes, const MsgHeader& h, const Wait& wait) {
  if (size() < 3 || nbytes > Board::kSlotBytes) return false;
  if (!board_decided_) join_board(h, wait);
  return board_ != nullptr;
}

// Collective, on the first small all-reduce, all-gather or barrier: all ranks
// join, or none does. Rank 0 creates the segment and hands its locator round the
// ring (which only ever carries it between ranks that proved the job's token);
// the others open it.
void Group::join_board(const MsgHeader& h, const Wait& wait) {
  int n = size();
  board_decided_ = true;  // without a board, unless everything below works on every rank
  // Both ring links through shared memory on every rank: the whole group is on one host.
  bool can = opts_.board && n <= Board::kMaxRanks && std::strcmp(right_->kind(), "shm") == 0 &&
             std::strcmp(left_->kind(), "shm") == 0;
  std::shared_ptr<SharedSegment> seg;
  const size_t block = 1 + kLocatorBytes;
  std::vector<uint8_t> mine(block, 0), offers(block * size_t(n));
  if (can && me_ == 0) {
    try {
      seg = create_segment(Board::bytes_for(n), opts_.named_shm);  // zeroed: every slot empty (seq 0)
      const std::string& loc = seg->locator();
      if (loc.size() > kLocatorBytes) fail(ErrorKind::Config, "locator too long");
      std::memcpy(mine.data() + 1, loc.data(), loc.size());
    } catch (const CommError&) {
      seg.reset();
      can = false;
    }
  }
  mine[0] = can ? 1 : 0;
  gather_ring(mine.data(), offers.data(), block, h, wait);
  if (!all_set(offers, block)) {
    if (seg) seg->release_name();
    return;
  }
  if (me_ != 0) {
    const char* loc = reinterpret_cast<const char*>(offers.data() + 1);
    try {
      seg = open_segment(std::string(loc, strnlen(loc, kLocatorBytes)), Board::bytes_for(n), false);
    } catch (const CommError&) {
      seg.reset();
    }
  }
  uint8_t opened = seg ? 1 : 0;
  std::vector<uint8_t> all_opened(size_t(n), 0);
  gather_ring(&opened, all_opened.data(), 1, h, wait);
  if (me_ == 0) seg->release_name();  // every rank has opened it or given up: no name left
  if (!all_set(all_opened, 1)) return;
  // With more ranks than cores, waits yield at once (spin.h).
  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  board_hot_spin_ = cores <= 0 || n <= cores;
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back(describe(r));
  auto board = std::make_unique<Board>(std::move(seg), me_, std::move(names), members_);
  std::lock_guard<std::mutex> lock(abort_mu_);
  board_ = std::move(board);
  if (aborted_) board_->mark_aborted(abort_reason_, give_up_origin_, int(give_up_why_));  // (gives up the first board op)
}

// Post, wait for every other rank's post, reduce all in rank order: every rank
// computes the same bits, as on the ring's small path.
void Group::board_all_reduce(const void* in, void* out, size_t count, Dtype t, ReduceOp op, const MsgHeader& h,
                             const Wait& wait) {
  uint64_t k = board_exchange(in, count * dtype_size(t), h, wait);
  if (count == 0) return;  // a barrier, or an empty vector
  reduce_to(out, board_->data(0, k), board_->data(1, k), count, t, op);
  for (int r = 2; r < size(); ++r) reduce_into(out, board_->data(r, k), count, t, op);
}

// Post, wait for every other rank's post, copy all out in rank order. `in` may be this
// rank's block of `out`: the copy comes from our slot, which holds it already.
void Group::board_all_gather(const void* in, void* out, size_t nbytes, const MsgHeader& h, const Wait& wait) {
  uint64_t k = board_exchange(in, nbytes, h, wait);
  auto* o = static_cast<uint8_t*>(out);
  for (int r = 0; r < size() && nbytes; ++r) std::memcpy(o + size_t(r) * nbytes, board_->data(r, k), nbytes);
}

// Every board op: post this rank's bytes as the next op, wait for every other rank's post.
// Returns the op's number: its slots (board_->data(r, k)) hold all contributions.
uint64_t Group::board_exchange(const void* in, size_t nbytes, const MsgHeader& h, const Wait& wait) {
  uint64_t k = ++board_ops_;
  board_->post(k, h, in, nbytes);
  wait_board(k, h, wait);
  op_moved_ += nbytes * size_t(size());  // ours posted, the others' read
  return k;
}

void Group::wait_board(uint64_t k, const MsgHeader& h, const Wait& wait) {
  int n = size(), next = 0;  // every rank below `next` has posted
  auto all_posted = [&] {
    while (next < n && (next == me_ || board_->posted(next, k, h))) ++next;
    return next == n;
  };
  Spin spin(board_hot_spin_);  // not restarted after a sleep: once spun, a wait only sleeps
  auto next_check = Clock::now() + kBusyCheck;
  Clock::time_point since{};  // the profile's wait: from the first look that found a post missing
  bool asleep = false;
  auto done = [&] {
    if (since != Clock::time_point{})
      op_wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count();
    if (asleep) activity_.moved(op_moved_);
  };
  for (;;) {
    uint32_t seen = board_->posts();  // before looking: a post after this wakes the sleep below
    // The gate decides (board.h); the slots say whom we wait for, and check each call's header.
    if (all_posted() && board_->complete(k)) return done();
    auto now = Clock::now();
    if (since == Clock::time_point{}) since = now;
    op_waited_on_ = next;
    if (spin.step(now)) continue;
    wait.check_abort();
    if (board_->aborted_by() || now >= next_check || now >= wait.deadline) {
      next_check = now + kBusyCheck;
      // The last posts may have come since the look above, and a rank done with the op may
      // have aborted the group since: with every post counted in, the op is complete all the same.
      if (all_posted() && board_->complete(k)) return done();
      check_board(next, k, h, wait, now);
    }
    if (!asleep) {
      asleep = true;
      activity_.waiting(next, op_moved_);
    }
    auto until = std::min(next_check, wait.deadline);
    board_->sleep(seen, std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::microseconds>(until - now).count()));
  }
}

// Why a board wait cannot go on, if it cannot: this group aborted, Ctrl-C, a rank
// that gave up, a neighbour gone or in another call, the deadline.
void Group::check_board(int first_missing, uint64_t k, const MsgHeader& h, const Wait& wait, Clock::time_point now) {
  wait.check_abort();
  if (wait.interrupted && wait.interrupted()) throw Interrupted();
  int n = size();
  // Past our own deadline we give the op up, unless every post was counted in first (it then
  // completes on every rank, ours included); name who we waited for.
  if (now >= wait.deadline) {
    if (!must_time_out(wait, true) || !board_->cancel(k)) return;
    std::string who;
    for (int r = first_missing; r < n; ++r)
      if (r != me_ && !board_->posted(r, k, h)) who += (who.empty() ? "" : ", ") + board_->name(r);
    timed_out(wait, who.empty() ? "the last rank to post" : who);
  }
  board_->complete(k);  // a rank that gave up on the op fails it here, whatever it marked on the board
  int right = (me_ + 1) % n, left = (me_ + n - 1) % n;
  for (auto [link, peer] : {std::pair<Link*, int>{right_.get(), right}, {left_.get(), left}}) {
    // A neighbour that sends a message of this op number called something else.
    if (auto got = link->waiting_header(); got && got->seq == h.seq) check_header(h, *got, link->name());
    // A neighbour's process that is gone closed its end of the link (its neighbours tell the rest).
    if (link->peer_left() && !board_->posted(peer, k, h)) peer_closed(link->name());
  }
}

}  // namespace mlxj
