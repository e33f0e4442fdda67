// Activity's lock-free reader, op names, and the profile's switch and rings.
#include "mlxj/activity.h"

#include <algorithm>
#include <new>
#include <thread>

namespace mlxj {

namespace {
std::atomic<bool> g_profiling{false};
std::atomic<uint32_t> g_generation{0};
std::atomic<size_t> g_capacity{16384};
std::atomic<bool> g_paused{false};
std::atomic<int64_t> g_pause_end_ns{-1};  // steady_ns() when the last pause ended
}  // namespace

void set_paused(bool paused) {
  if (!paused && g_paused.load()) g_pause_end_ns.store(steady_ns());
  g_paused.store(paused);
}

PauseView pause_state() {
  PauseView v;
  v.now = g_paused.load();
  int64_t end = g_pause_end_ns.load();
  if (end >= 0) v.since_end_ns = std::max<int64_t>(0, steady_ns() - end);
  return v;
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Init: return "init";
    case OpKind::AllSum: return "all_sum";
    case OpKind::AllMax: return "all_max";
    case OpKind::AllMin: return "all_min";
    case OpKind::AllGather: return "all_gather";
    case OpKind::SumScatter: return "sum_scatter";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
    case OpKind::Barrier: return "barrier";
    case OpKind::Split: return "split";
    case OpKind::None: break;
  }
  return "";
}

const char* op_state_name(OpState s) {
  return s == OpState::Waiting ? "waiting" : s == OpState::Running ? "running" : "idle";
}

ActivityView Activity::read() const {
  for (unsigned tries = 0;; ++tries) {
    uint32_t v1 = version_.load(std::memory_order_acquire);
    if (!(v1 & 1)) {
      ActivityView a;
      a.state = OpState(state_.load(std::memory_order_acquire));
      a.op = OpKind(op_.load(std::memory_order_acquire));
      a.dtype = Dtype(dtype_.load(std::memory_order_acquire));
      a.seq = seq_.load(std::memory_order_acquire);
      a.nbytes = nbytes_.load(std::memory_order_acquire);
      a.moved = moved_.load(std::memory_order_acquire);
      a.start_ns = start_ns_.load(std::memory_order_acquire);
      a.timeout_us = timeout_us_.load(std::memory_order_acquire);
      a.waiting_on = waiting_on_.load(std::memory_order_acquire);
      if (version_.load(std::memory_order_acquire) == v1) return a;
    }
    if (tries > 64) std::this_thread::yield();  // the writer was preempted mid-update
  }
}

bool profiling() { return g_profiling.load(std::memory_order_relaxed); }

void start_profiling(size_t capacity) {
  g_capacity.store(capacity ? capacity : 1);
  g_generation.fetch_add(1);
  g_profiling.store(true);
}

void stop_profiling() { g_profiling.store(false); }

void ProfileRing::add(const ProfileRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t gen = g_generation.load();
  if (gen != gen_ || !buf_) {  // a new profile: forget the last one's records
    size_t cap = g_capacity.load();
    if (cap != cap_ || !buf_) {
      buf_.reset(new (std::nothrow) ProfileRecord[cap]);  // called from a destructor: never throws
      cap_ = buf_ ? cap : 0;
      if (!buf_) return;  // no memory for this profile's ring: the group records nothing
    }
    gen_ = gen;
    written_ = 0;
  }
  buf_[written_ % cap_] = r;
  ++written_;
}

std::vector<ProfileRecord> ProfileRing::take(uint64_t* dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ProfileRecord> out;
  *dropped = 0;
  if (!buf_ || gen_ != g_generation.load()) return out;
  uint64_t first = written_ > cap_ ? written_ - cap_ : 0;
  *dropped = first;
  for (uint64_t i = first; i < written_; ++i) out.push_back(buf_[i % cap_]);
  written_ = 0;
  return out;
}

}  // namespace mlxj
