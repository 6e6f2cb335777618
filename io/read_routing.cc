// The read router's routing: which drives can serve a read, its split over them (water filling
// on measured rates), the parts waiting for a drive, their outcomes, rates, and fail-over to
// another copy. Everything here runs under ReadRouter::Impl::mu (io/read_router_impl.h).
#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "io/read_router_impl.h"

namespace k3::io {

using router_internal::kRateWindowBytes;

// ---------------------------------------------------------------------------------------------
// Routing.

// The sources that can serve the whole range, one per device. A range a stripe holds is read
// from the stripes and the volumes' copies, not from the file itself, which may have given its
// space back (k3 stripe --punch).
std::vector<int> ReadRouter::Impl::Candidates(const File& f, uint64_t offset,
                                              uint64_t length) const {
  const uint64_t end = offset + length;
  // The stripes that may hold the range: those starting at the last start at or before it
  // (pieces are disjoint, or the same piece in several directories).
  const auto stripes = std::span(f.sources).subspan(f.first_stripe);
  auto after = std::upper_bound(stripes.begin(), stripes.end(), offset,
                                [](uint64_t at, const Source& s) { return at < s.begin; });
  size_t from = f.sources.size();
  if (after != stripes.begin()) {
    const uint64_t begin = std::prev(after)->begin;
    for (auto it = std::prev(after); it->begin == begin; --it) {
      from = f.first_stripe + static_cast<size_t>(it - stripes.begin());
      if (it == stripes.begin()) break;
    }
  }
  const size_t to = f.first_stripe + static_cast<size_t>(after - stripes.begin());
  bool striped = false;
  for (size_t i = from; i < to; ++i) striped |= end <= f.sources[i].end;
  std::vector<int> out;
  std::vector<int> seen_devices;
  for (size_t i = 0; i < to; ++i) {
    if (i == f.first_stripe) i = std::max(i, from);
    if (i >= to) break;
    const Source& s = f.sources[i];
    if (s.bad) continue;
    if (s.stripe ? end > s.end : (i == 0 && striped)) continue;
    if (std::find(seen_devices.begin(), seen_devices.end(), s.device) != seen_devices.end()) {
      continue;
    }
    seen_devices.push_back(s.device);
    out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<std::pair<uint64_t, uint64_t>> ReadRouter::Impl::Segments(const File& f,
                                                                      uint64_t offset,
                                                                      uint64_t length) const {
  const uint64_t end = offset + length;
  std::vector<uint64_t> cuts;
  // Pieces are sorted by their start and disjoint (or one piece in several directories), so
  // those that can cut the range are the last ones starting at or before it and those starting
  // inside it: a binary search, not a walk from the file's first piece on every read.
  const auto stripes = std::span(f.sources).subspan(f.first_stripe);
  auto first = std::upper_bound(stripes.begin(), stripes.end(), offset,
                                [](uint64_t at, const Source& s) { return at < s.begin; });
  if (first != stripes.begin()) {
    const uint64_t begin = std::prev(first)->begin;
    while (first != stripes.begin() && std::prev(first)->begin == begin) --first;
  }
  for (size_t i = f.first_stripe + static_cast<size_t>(first - stripes.begin());
       i < f.sources.size() && f.sources[i].begin < end; ++i) {
    const Source& s = f.sources[i];
    for (uint64_t at : {s.begin, s.end}) {
      if (at > offset && at < end && at % kDirectAlignment == 0) cuts.push_back(at);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t at = offset;
  for (uint64_t cut : cuts) {
    out.emplace_back(at, cut - at);
    at = cut;
  }
  out.emplace_back(at, end - at);
  return out;
}

// Parts of [offset, offset + length) for the candidates, sized so that each device finishes
// its part at the same time given what it is already reading and its rate (water filling), no
// part shorter than min_part_bytes, boundaries at 4 KiB so that every part reads straight into
// its place in the buffer.
std::vector<ReadRouter::Impl::Part> ReadRouter::Impl::Split(const File& f,
                                                            const std::vector<int>& candidates,
                                                            uint64_t offset, uint64_t length,
                                                            std::span<uint8_t> buffer) const {
  struct Share {
    int source;
    double backlog, rate, bytes;
  };
  std::vector<Share> shares;
  for (int c : candidates) {
    const Device& d = *devices[f.sources[c].device];
    shares.push_back({c, d.backlog(), d.report.rate, 0});
  }
  std::stable_sort(shares.begin(), shares.end(),
                   [](const Share& a, const Share& b) { return a.backlog < b.backlog; });
  const double total = static_cast<double>(length);
  const double min_part = static_cast<double>(options.min_part_bytes);
  for (;;) {
    // The time T at which the devices used finish together: sum over them of
    // (T - backlog) * rate = length, using every device whose backlog ends before T.
    double weighted = 0, rates = 0, finish = 0;
    size_t used = 0;
    for (; used < shares.size(); ++used) {
      const double t = (total + weighted + shares[used].backlog * shares[used].rate) /
                       (rates + shares[used].rate);
      if (used > 0 && shares[used].backlog >= finish) break;
      weighted += shares[used].backlog * shares[used].rate;
      rates += shares[used].rate;
      finish = t;
    }
    shares.resize(used);
    auto smallest = shares.begin();
    for (auto it = shares.begin(); it != shares.end(); ++it) {
      it->bytes = (finish - it->backlog) * it->rate;
      if (it->bytes < smallest->bytes) smallest = it;
    }
    if (shares.size() == 1 || smallest->bytes >= min_part) break;
    shares.erase(smallest);
  }
  std::vector<Part> parts;
  const uint64_t head = AlignDown(offset);
  uint64_t at = offset;
  double planned = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    planned += shares[i].bytes;
    uint64_t to = offset + length;
    if (i + 1 < shares.size()) {
      to = std::clamp<uint64_t>(AlignDown(offset + static_cast<uint64_t>(planned)), at, to);
    }
    if (to == at && i + 1 < shares.size()) continue;
    const uint64_t start = at == offset ? head : at;
    parts.push_back({.source = shares[i].source,
                     .offset = at,
                     .length = to - at,
                     .buffer = buffer.subspan(start - head)});
    at = to;
  }
  return parts;
}

// With several drives each keeps few parts in flight, the rest waiting here by priority: a
// drive given a whole layer's reads at once serves them in its own order and they all land at
// the end of the layer, where in order the first experts multiply while the rest arrive (on
// three emulated drives sharing one disk, 32 in flight each doubled a decode token's time).
// Prefetches leave one place free, so that a demand read never waits behind guesses.
bool ReadRouter::Impl::HasRoom(const Device& d, Priority p) const {
  if (devices.size() < 2) return true;
  const int most = std::min(options.engine.queue_depth, options.parts_in_flight_per_drive);
  return d.in_flight < (p == Priority::kPrefetch && most > 1 ? most - 1 : most);
}

absl::Status ReadRouter::Impl::SubmitPart(Request& r, size_t index) {
  Part& p = r.parts[index];
  p.inner = 0;
  Device& d = *devices[files[r.spec.file].sources[p.source].device];
  if (!HasRoom(d, r.spec.priority)) {
    d.waiting[static_cast<int>(r.spec.priority)].emplace_back(r.id, index);
    d.outstanding += p.length;
    return absl::OkStatus();
  }
  absl::Status s = Send(r, index);
  if (s.ok()) d.outstanding += p.length;
  return s;
}

// The parts waiting for a drive, while it has room: demand first. A part of a request that has
// stopped meanwhile is done without a read.
void ReadRouter::Impl::Pump(Device& d, std::vector<Finished>* out) {
  for (int p = 0; p < kNumPriorities; ++p) {
    while (!d.waiting[p].empty() && HasRoom(d, static_cast<Priority>(p))) {
      const auto [id, index] = d.waiting[p].front();
      d.waiting[p].pop_front();
      Request& r = *live.at(id);
      Part& part = r.parts[index];
      if (!r.cancelled && r.error.ok() && !stopping) {
        absl::Status s = Send(r, index);
        if (s.ok()) continue;
        Stop(r, s);
      }
      d.outstanding -= part.length;
      part.done = true;
      if (--r.open_parts == 0) Finish(r, out);
    }
  }
}

absl::Status ReadRouter::Impl::Send(Request& r, size_t index) {
  Part& p = r.parts[index];
  File& f = files[r.spec.file];
  Source& s = f.sources[p.source];
  Device& d = *devices[s.device];
  const ReadId id = r.id;
  auto inner =
      d.engine->Submit({.file = s.file,
                        .offset = static_cast<uint64_t>(static_cast<int64_t>(p.offset) + s.delta),
                        .length = p.length,
                        .buffer = p.buffer,
                        .priority = r.spec.priority,
                        .on_complete = [this, id, index](ReadResult result) {
                          OnPart(id, index, std::move(result));
                        }});
  if (!inner.ok()) return inner.status();
  p.inner = *inner;
  if (d.in_flight++ == 0) d.busy_since = absl::Now();
  return absl::OkStatus();
}

void ReadRouter::Impl::Measure(Device& d, uint64_t bytes) {
  const absl::Time now = absl::Now();
  d.report.bytes += bytes;
  ++d.report.reads;
  d.window_bytes += bytes;
  const double busy = d.busy_now(now);
  if (d.window_bytes >= kRateWindowBytes && busy > d.window_busy) {
    const double rate = static_cast<double>(d.window_bytes) / (busy - d.window_busy);
    d.report.rate = d.measured ? (d.report.rate + rate) / 2 : rate;
    d.measured = true;
    d.window_bytes = 0;
    d.window_busy = busy;
  }
}

void ReadRouter::Impl::OnPart(ReadId id, size_t index, ReadResult result) {
  std::vector<Finished> out;
  {
    AnnotatedMutexLock lock(&mu);
    auto it = live.find(id);
    if (it == live.end()) return;  // cannot happen: a request lives until its parts are done
    Request& r = *it->second;
    Part& p = r.parts[index];
    const Source& s = files[r.spec.file].sources[p.source];
    Device& d = *devices[s.device];
    d.outstanding -= p.length;
    if (--d.in_flight == 0)
      d.report.busy_seconds += absl::ToDoubleSeconds(absl::Now() - d.busy_since);
    r.retries += result.retries;
    bool again = false;  // read from another copy
    if (result.status.ok()) {
      Measure(d, p.length);
    } else if (absl::IsCancelled(result.status) || r.cancelled || !r.error.ok() || stopping ||
               !FailOver(r, index, result.status)) {
      Stop(r, result.status);
    } else {
      again = true;
    }
    if (!again) {
      p.done = true;
      if (--r.open_parts == 0) Finish(r, &out);
    }
    Pump(d, &out);
  }
  Deliver(out);
}

// The part's copy failed (after the engine's own retries): read it from another one, and never
// read that copy again this run. False when no other copy holds the part.
bool ReadRouter::Impl::FailOver(Request& r, size_t index, const absl::Status& error) {
  Part& p = r.parts[index];
  File& f = files[r.spec.file];
  Source& failed = f.sources[p.source];
  const bool known = failed.bad;  // another read of it, in flight when it was set aside
  failed.bad = true;
  Device& from = *devices[failed.device];
  const std::vector<int> others = Candidates(f, p.offset, p.length);
  if (others.empty()) {  // the run stops on this error, as with one copy
    failed.bad = false;
    return false;
  }
  // The one that will finish first.
  int best = others[0];
  for (int c : others) {
    const Device& d = *devices[f.sources[c].device];
    const Device& b = *devices[f.sources[best].device];
    if (d.backlog() + p.length / d.report.rate < b.backlog() + p.length / b.report.rate) best = c;
  }
  const Source& to = f.sources[best];
  if (!known) {
    Warn(absl::StrCat(std::string(error.message()), " (device ", from.report.id,
                      "); read again from ", to.path, " (device ", devices[to.device]->report.id,
                      "), and ", failed.path, " is not read again"));
  }
  ++from.report.failovers;
  ++r.retries;
  p.source = best;
  if (absl::Status s = SubmitPart(r, index); !s.ok()) return false;
  return true;
}

// No more parts of `r` are wanted: it failed (or was cancelled); the parts in flight are
// cancelled and the request finishes when the last has landed.
void ReadRouter::Impl::Stop(Request& r, absl::Status error) {
  if (r.error.ok() && !r.cancelled) r.error = std::move(error);
  for (Part& p : r.parts) {
    if (!p.done && p.inner != 0) {
      devices[files[r.spec.file].sources[p.source].device]->engine->Cancel(p.inner);
    }
  }
}

void ReadRouter::Impl::Finish(Request& r, std::vector<Finished>* out) {
  const File& f = files[r.spec.file];
  ReadResult result{.id = r.id,
                    .user_data = r.spec.user_data,
                    .priority = r.spec.priority,
                    .latency = absl::Now() - r.submitted,
                    .retries = r.retries};
  if (r.cancelled) {
    result.status =
        absl::CancelledError(absl::StrCat("read of ", r.spec.length, " bytes at offset ",
                                          r.spec.offset, " of ", f.path, " cancelled"));
  } else if (!r.error.ok()) {
    result.status = r.error;
  } else {
    result.data = r.spec.buffer.subspan(r.spec.offset % kDirectAlignment, r.spec.length);
    if (r.logged && logging) {
      log.emplace_back(r.id, LoggedRead{.file = r.spec.file,
                                        .offset = r.spec.offset,
                                        .length = r.spec.length,
                                        .priority = r.spec.priority});
    }
  }
  if (r.spec.on_complete) {
    out->push_back({std::move(result), std::move(r.spec.on_complete)});
  } else {
    done.Add(std::move(result));
  }
  live.erase(r.id);
}

std::optional<ReadResult> ReadRouter::Impl::ClaimOldest() { return done.ClaimOldest(); }

}  // namespace k3::io
