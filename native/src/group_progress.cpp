// The progress engine: a step's transfers moved over its links until done, reducing as bytes
// arrive; abort, Ctrl-C and the op's deadline are honoured while it waits.
#include <algorithm>
#include <cerrno>
#include <vector>

#include "mlxj/group.h"
#include "mlxj/spin.h"

namespace mlxj {

namespace {

constexpr size_t kReduceGrain = 64 * 1024;  // reduce arriving data in pieces this big

// Folds the newly arrived whole elements of [from, to) into the fold's output.
void fold_arrived(const Fold& f, const uint8_t* got, size_t from, size_t to) {
  size_t es = dtype_size(f.t), a = from / es * es, b = to / es * es;
  if (b <= a) return;
  const uint8_t* mine = f.mine + a;
  reduce_to(f.out + a, f.mine_first ? mine : got + a, f.mine_first ? got + a : mine, (b - a) / es, f.t, f.op);
}

}  // namespace

void Group::run(Step& step, const Wait& wait) {
  Link* links[4];
  size_t nl = 0;
  bool spinning = false;
  for (size_t i = 0; i < step.n; ++i) {
    Xfer& x = step.xs[i];
    if (x.send) {
      x.link->begin_send(x.header, x.data, x.size);
    } else {
      x.link->begin_recv(x.header, x.data, x.size, x.fold.out ? &x.fold : nullptr);
      if (x.link->folds()) x.fold.out = nullptr;  // nothing left for us to fold
    }
    if (std::find(links, links + nl, x.link) == links + nl) {
      links[nl++] = x.link;
      spinning |= x.link->spins();
    }
  }
  std::vector<pollfd> fds;
  Spin spin;
  Clock::time_point next_check = Clock::now() + kBusyCheck;
  // Waiting (the profile's wait): from the first pass that moved nothing until bytes move again.
  Clock::time_point idle_since{};
  bool idle = false, asleep = false;
  for (;;) {
    bool moved = false, busy = false;
    for (size_t i = 0; i < nl; ++i) moved |= links[i]->progress();
    for (size_t i = 0; i < step.n; ++i) {
      Xfer& x = step.xs[i];
      if (x.send || !x.fold.out) continue;
      size_t got = x.link->receiving() ? x.link->received() : x.size;
      if (got > x.seen && (got == x.size || got - x.seen >= kReduceGrain)) {
        fold_arrived(x.fold, x.data, x.seen, got);
        x.seen = got;
      }
    }
    for (size_t i = 0; i < nl; ++i) busy |= links[i]->sending() || links[i]->receiving();
    if (!busy) {
      if (idle) op_wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - idle_since).count();
      for (size_t i = 0; i < step.n; ++i) op_moved_ += step.xs[i].size;
      activity_.moved(op_moved_);
      return;
    }
    auto now = Clock::now();
    // Whatever the loop does (data flowing, poll() returning at once without
    // progress), abort, Ctrl-C and the deadline are honoured every kBusyCheck.
    if (now >= next_check) {
      next_check = now + kBusyCheck;
      check_stop(links, nl, moved, wait, now);
    }
    if (moved) {
      if (idle) {
        op_wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(now - idle_since).count();
        idle = false;
      }
      if (asleep) {
        asleep = false;
        activity_.moved(op_moved_);
      }
      spin.restart();
      continue;
    }
    if (!idle) {
      idle = true;
      idle_since = now;
    }
    if (spinning) {  // a short bounded spin beats a sleep and a wake-up
      if (spin.step(now)) continue;
      spin.restart();
    }
    if (!asleep) {  // about to sleep: say on whom (a peer whose bytes we lack, else one not taking ours)
      asleep = true;
      const Link* on = nullptr;
      for (size_t i = 0; i < nl && !on; ++i)
        if (links[i]->receiving()) on = links[i];
      for (size_t i = 0; i < nl && !on; ++i)
        if (links[i]->sending()) on = links[i];
      op_waited_on_ = on ? peer_of(on) : -1;
      activity_.waiting(op_waited_on_, op_moved_);
    }
    fds.clear();
    for (size_t i = 0; i < nl; ++i) links[i]->wait_set(fds);
    fds.push_back(pollfd{abort_waker_.fd(), POLLIN, 0});
    if (now >= wait.deadline) check_stop(links, nl, false, wait, now);
    auto until = std::min(next_check, wait.deadline);
    int rc = ::poll(fds.data(), fds.size(), int(std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1));
    wait.check_abort();
    if (rc < 0 && errno == EINTR && wait.interrupted && wait.interrupted()) throw Interrupted();
  }
}

void Group::check_stop(Link* const* links, size_t nlinks, bool moving, const Wait& wait, Clock::time_point now) {
  wait.check_abort();
  if (wait.interrupted && wait.interrupted()) throw Interrupted();
  for (size_t i = 0; i < nlinks; ++i)
    if (links[i]->receiving() || links[i]->sending()) links[i]->check_alive(now);
  if (now < wait.deadline || !must_time_out(wait)) return;
  if (moving)
    fail(ErrorKind::Timeout, wait.timed_out() + " while still transferring" +
                                 (op_refused_by_ >= 0 ? " (" + describe(op_refused_by_) + " had not entered it)" : ""));
  std::string who;
  for (size_t i = 0; i < nlinks; ++i)
    if (links[i]->receiving() || links[i]->sending()) who += (who.empty() ? "" : ", ") + links[i]->name();
  timed_out(wait, who);
}

void Group::timed_out(const Wait& wait, const std::string& who) {
  fail(ErrorKind::Timeout, wait.timed_out() + " waiting for " + who +
                               ": that rank may have skipped this call, failed, or be stuck elsewhere");
}

}  // namespace mlxj
