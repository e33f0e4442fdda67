// Ring algorithms. Large reductions: pipelined reduce-scatter + all-gather,
// half of the data going each way round the ring, arriving data reduced while
// the rest is still in flight. Small reductions: every rank gathers all
// contributions (through the board when the group shares a host, group_board.cpp)
// and reduces them in rank order. Either way each element's
// result is computed in one order, so every rank gets the same bits.
#include <cstring>
#include <memory>
#include <string>

#include "mlxj/errors.h"
#include "mlxj/group.h"

namespace mlxj {

namespace {

OpCode reduce_code(ReduceOp op) {
  return op == ReduceOp::Sum ? OpCode::AllSum : op == ReduceOp::Max ? OpCode::AllMax : OpCode::AllMin;
}

constexpr size_t kOneLinkLimit = 64 * 1024;

struct Range {
  size_t offset, count;  // in elements
};

}  // namespace

// Which elements virtual segment v of direction d covers. all_reduce layout: the
// first half of the buffer goes right, the second left, each cut into n
// segments. sum_scatter layout: segment a is rank a's slice, its halves split
// between the directions, and v is mapped so that rank r ends up owning slice r.
static Range segment(bool right, int v, int n, size_t count, bool scatter) {
  if (!scatter) {
    size_t half = count / 2, base = right ? 0 : half, len = right ? half : count - half;
    return {base + len * size_t(v) / size_t(n), len * size_t(v + 1) / size_t(n) - len * size_t(v) / size_t(n)};
  }
  size_t slice = count / size_t(n), half = slice / 2;
  int actual = right ? (v + n - 1) % n : (n + 1 - v) % n;
  return right ? Range{size_t(actual) * slice, half} : Range{size_t(actual) * slice + half, slice - half};
}

namespace {
int wrap(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

// One direction of the two rings: where data goes, where it comes from, and this
// rank's position (the left ring numbers ranks backwards).
Group::RingDir Group::ring_dir(bool right) const {
  int n = size();
  return right ? RingDir{right_.get(), left_.get(), me_} : RingDir{left_.get(), right_.get(), (n - me_) % n};
}

// Step 0 sends a segment of our input, every later step the segment the step
// before folded into buf. Each segment is folded once, from our input, which it
// never reads after that: so buf needs no copy of the input first and may be it.
void Group::ring_reduce_scatter_step(int s, size_t count, Dtype t, ReduceOp op, const uint8_t* src, uint8_t* buf,
                                     MsgHeader h, bool scatter, const Wait& wait) {
  int n = size();
  size_t es = dtype_size(t);
  Step step;
  for (int d = 0; d < 2; ++d) {
    RingDir r = ring_dir(d == 0);
    Range out = segment(d == 0, wrap(r.pos - s, n), n, count, scatter);
    Range in = segment(d == 0, wrap(r.pos - s - 1, n), n, count, scatter);
    uint8_t* t_in = r.from->folds() ? nullptr : scratch(Slot(int(Slot::DirRight) + d), in.count * es);
    step.add(r.to, true, h, (s == 0 ? src : buf) + out.offset * es, out.count * es);
    step.add(r.from, false, h, t_in, in.count * es).fold =
        Fold{buf + in.offset * es, src + in.offset * es, true, t, op};
  }
  run(step, wait);
}

void Group::ring_all_gather_step(int s, size_t count, Dtype t, uint8_t* buf, MsgHeader h, bool scatter,
                                 const Wait& wait) {
  int n = size();
  size_t es = dtype_size(t);
  Step step;
  for (int d = 0; d < 2; ++d) {
    RingDir r = ring_dir(d == 0);
    Range out = segment(d == 0, wrap(r.pos + 1 - s, n), n, count, scatter);
    Range in = segment(d == 0, wrap(r.pos - s, n), n, count, scatter);
    step.add(r.to, true, h, buf + out.offset * es, out.count * es);
    step.add(r.from, false, h, buf + in.offset * es, in.count * es);
  }
  run(step, wait);
}

// Ring all-gather of equal blocks, going both ways round the ring at once:
// after step k every rank holds the blocks of the ranks up to k away on either
// side, so ceil((n-1)/2) steps suffice (not n-1), and each link still carries
// only half of the data. With n even, the last step brings the block of the
// rank opposite, half from each side.
void Group::gather_ring(const void* in, void* out, size_t nbytes, MsgHeader h, const Wait& wait) {
  int n = size();
  auto* o = static_cast<uint8_t*>(out);
  if (nbytes && o + size_t(me_) * nbytes != in) std::memcpy(o + size_t(me_) * nbytes, in, nbytes);
  auto block = [&](int r, size_t offset) { return o ? o + size_t(wrap(r, n)) * nbytes + offset : nullptr; };
  for (int k = 1; 2 * k <= n; ++k) {
    size_t going_right = 2 * k == n ? nbytes / 2 : nbytes, left_from = 2 * k == n ? going_right : 0;
    Step step;
    step.add(right_.get(), true, h, block(me_ - k + 1, 0), going_right);
    step.add(left_.get(), false, h, block(me_ - k, 0), going_right);
    step.add(left_.get(), true, h, block(me_ + k - 1, left_from), nbytes - left_from);
    step.add(right_.get(), false, h, block(me_ + k, left_from), nbytes - left_from);
    run(step, wait);
  }
}

void Group::small_all_reduce(const void* in, void* out, size_t count, Dtype t, ReduceOp op, MsgHeader h,
                             const Wait& wait) {
  int n = size();
  size_t nbytes = count * dtype_size(t);
  uint8_t* all = scratch(Slot::Gather, nbytes * size_t(n));
  gather_ring(in, all, nbytes, h, wait);
  std::memcpy(out, all, nbytes);  // rank 0's contribution, then the others in rank order
  for (int r = 1; r < n; ++r) reduce_into(out, all + size_t(r) * nbytes, count, t, op);
}

// Two ranks: each sends its whole vector (half over each link, so both TCP
// paths work) and reduces the peer's data as it arrives: one step, no stalls.
// The result is (rank 0's data) op (rank 1's data) on both ranks.
void Group::pair_all_reduce(const void* in, void* out, size_t count, Dtype t, ReduceOp op, MsgHeader h,
                            const Wait& wait) {
  size_t es = dtype_size(t), nbytes = count * es;
  // Small messages take one link each way (half the synchronisation); large ones split over both.
  size_t half = nbytes <= kOneLinkLimit ? nbytes : (count / 2) * es;
  const uint8_t* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (out == in && nbytes) {  // in place: send from a copy, the result overwrites the input
    uint8_t* copy = scratch(Slot::Work, nbytes);
    std::memcpy(copy, in, nbytes);
    src = copy;
  }
  // The peer's bytes land in `out` and are combined with ours there, in rank order.
  bool first = me_ == 0;
  Step step;
  step.add(right_.get(), true, h, src, half);
  step.add(left_.get(), false, h, dst, half).fold = Fold{dst, src, first, t, op};
  if (half < nbytes) {
    step.add(left_.get(), true, h, src + half, nbytes - half);
    step.add(right_.get(), false, h, dst + half, nbytes - half).fold = Fold{dst + half, src + half, first, t, op};
  }
  run(step, wait);
}

void Group::all_reduce(const void* in, void* out, size_t count, Dtype t, ReduceOp op, const CallOptions& opts) {
  size_t nbytes = count * dtype_size(t);
  OpKind kind = op == ReduceOp::Sum ? OpKind::AllSum : op == ReduceOp::Max ? OpKind::AllMax : OpKind::AllMin;
  guarded(opts, op_name(uint8_t(reduce_code(op))), {kind, nbytes, t}, [&](const Wait& wait) {
    int n = size();
    if (n == 1) {
      if (out != in && nbytes) std::memmove(out, in, nbytes);
      return;
    }
    MsgHeader h = header(reduce_code(op), t, nbytes);
    if (n == 2) return pair_all_reduce(in, out, count, t, op, h, wait);
    if (board_ready(nbytes, h, wait)) return board_all_reduce(in, out, count, t, op, h, wait);
    if (nbytes <= opts_.small_limit || count < size_t(2 * n)) return small_all_reduce(in, out, count, t, op, h, wait);
    auto* buf = static_cast<uint8_t*>(out);
    auto* src = static_cast<const uint8_t*>(in);
    for (int s = 0; s + 1 < n; ++s) ring_reduce_scatter_step(s, count, t, op, src, buf, h, false, wait);
    for (int s = 0; s + 1 < n; ++s) ring_all_gather_step(s, count, t, buf, h, false, wait);
  });
}

void Group::all_gather(const void* in, void* out, size_t nbytes, Dtype t, const CallOptions& opts) {
  guarded(opts, "all_gather", {OpKind::AllGather, nbytes, t}, [&](const Wait& wait) {
    if (size() == 1) {
      if (out != in && nbytes) std::memmove(out, in, nbytes);
      return;
    }
    MsgHeader h = header(OpCode::AllGather, t, nbytes);
    if (board_ready(nbytes, h, wait)) return board_all_gather(in, out, nbytes, h, wait);
    gather_ring(in, out, nbytes, h, wait);
  });
}

void Group::reduce_scatter(const void* in, void* out, size_t count, Dtype t, ReduceOp op, const CallOptions& opts) {
  guarded(opts, "sum_scatter", {OpKind::SumScatter, count * size_t(size()) * dtype_size(t), t}, [&](const Wait& wait) {
    int n = size();
    size_t es = dtype_size(t), total = count * size_t(n);
    if (n == 1) {
      if (out != in && total) std::memmove(out, in, total * es);
      return;
    }
    MsgHeader h = header(OpCode::SumScatter, t, total * es);
    uint8_t* work = scratch(Slot::Work, total * es);
    auto* src = static_cast<const uint8_t*>(in);
    for (int s = 0; s + 1 < n; ++s) ring_reduce_scatter_step(s, total, t, op, src, work, h, true, wait);
    if (count) std::memcpy(out, work + size_t(me_) * count * es, count * es);
  });
}

}  // namespace mlxj
