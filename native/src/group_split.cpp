// split(): every rank gets its new group, or every rank raises (issue 44).
//
// 1. The colours and keys are gathered over this group: an agreed op like any other (a rank whose
//    timeout strikes first asks the others; see must_time_out), so either every rank has them or
//    none does.
// 2. Having them, every rank knows that every rank entered the split: its timeout no longer
//    applies (it could fail a split another rank completes). Each rank connects its new group's
//    ring within a bound of its own (kFormBound past the gather, or the call's later deadline);
//    Ctrl-C and abort still end it.
// 3. Commit: a second gather over this group's links, sent only by a rank whose new group formed.
//    A rank whose forming failed gives up on this group instead, withdrawing from the split, which
//    fails the commit everywhere. No rank returns a group before every rank's commit has arrived.
#include <algorithm>
#include <utility>

#include "mlxj/group.h"

namespace mlxj {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64: group ids of splits
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// How long forming the new group may take once every rank has entered the split, at least (a
// peer's connections only fail to come when it is stuck or gone: its forming then fails the commit).
constexpr auto kFormBound = std::chrono::seconds(10);

}  // namespace

std::shared_ptr<Group> Group::split(int color, int key, const CallOptions& opts, const CoreOptions* options) {
  std::shared_ptr<Group> sub;
  guarded(opts, "split", {OpKind::Split, 8, Dtype::Int32}, [&](const Wait& wait) {
    int n = size();
    std::vector<int32_t> all(2 * n);
    int32_t mine[2] = {int32_t(color), int32_t(key < 0 ? me_ : key)};
    gather_ring(mine, all.data(), sizeof mine, header(OpCode::Split, Dtype::Int32, sizeof mine), wait);
    // Every rank has entered: from here on only the bound below, Ctrl-C and abort end the split.
    if (wait.deadline != Clock::time_point::max())
      wait.deadline = std::max(wait.deadline, Clock::now() + std::max<Clock::duration>(kFormBound, ctx_->options().dead_peer()));
    std::vector<std::pair<std::pair<int32_t, int>, int>> same;  // ((key, rank), world rank)
    for (int r = 0; r < n; ++r)
      if (all[2 * r] == color) same.push_back({{all[2 * r + 1], r}, members_[r]});
    std::sort(same.begin(), same.end());
    std::vector<int> members;
    for (auto& s : same) members.push_back(s.second);
    uint64_t id = mix(id_ ^ mix(uint64_t(++splits_) << 32 ^ uint32_t(color)));
    CoreOptions sub_options = options ? *options : opts_;
    const CoreOptions& world = ctx_->options();  // the connections' settings stay the world's
    sub_options.token = world.token;
    sub_options.verbose = world.verbose;
    sub_options.dead_peer_timeout = world.dead_peer_timeout;
    std::shared_ptr<Group> fresh(new Group(ctx_, id, std::move(members), std::move(sub_options)));
    fresh->watch_for_peers_leaving();
    // The new group's forming answers to its own abort (nobody else holds it yet), this split's
    // bound and Ctrl-C; an abort of this group from another thread fails the commit below.
    Wait own = fresh->make_wait(opts, "split");
    own.deadline = wait.deadline;
    try {
      fresh->connect_ring(own);
    } catch (...) {
      fresh->abort("split: forming this group failed on this rank");
      throw;
    }
    try {
      uint8_t formed = 1;
      std::vector<uint8_t> formed_all(size_t(n), 0);
      gather_ring(&formed, formed_all.data(), 1, header(OpCode::Split, Dtype::UInt8, 1), wait);
    } catch (...) {
      fresh->abort("split: the split failed on another rank");
      throw;
    }
    sub = std::move(fresh);
  });
  return sub;
}

}  // namespace mlxj
