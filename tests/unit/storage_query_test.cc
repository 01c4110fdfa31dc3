// storage/reader.h queries checked against brute force over forEachCall: callsInWindow (the call_tiles
// time index) on traces with 1-3 ranks, out-of-order ids, negative times, long and zero-length calls;
// timeline() on both paths (raw calls and tiles, the latter on a 200k-call trace); timeExtent();
// callStatistics(); lateness(); the size histogram.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradscope/storage/reader.h"
#include "gradscope/storage/schema.h"
#include "gradscope/storage/writer.h"
#include "synthetic_trace.h"
#include "test_util.h"

namespace gradscope::storage {
namespace {

using test::TempDir;

constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

struct Trace {
  std::string path;
  std::vector<CallRecord> calls;  // as written, ids set, in id order
  std::vector<std::int64_t> rank_ids;
};

// Does call `c` belong in the window [t0, t1)? The header's rule (start < t1 and end > t0), with a
// zero-length call counted when its instant lies in the window.
bool overlaps(const CallRecord& c, std::int64_t t0, std::int64_t t1) {
  return c.start_ns < t1 && (c.end_ns > t0 || (c.end_ns == c.start_ns && c.start_ns >= t0));
}

std::vector<std::int64_t> bruteWindow(const Trace& trace, std::int64_t rank_id, std::int64_t t0,
                                      std::int64_t t1) {
  std::vector<const CallRecord*> hits;
  if (t1 > t0)
    for (const CallRecord& c : trace.calls)
      if (c.rank_id == rank_id && overlaps(c, t0, t1)) hits.push_back(&c);
  std::sort(hits.begin(), hits.end(), [](const CallRecord* a, const CallRecord* b) {
    return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->id < b->id;
  });
  std::vector<std::int64_t> ids;
  for (const CallRecord* c : hits) ids.push_back(c->id);
  return ids;
}

std::vector<std::int64_t> idsOf(const std::vector<CallRecord>& calls) {
  std::vector<std::int64_t> ids;
  for (const CallRecord& c : calls) ids.push_back(c.id);
  return ids;
}

// A trace that looks like a job with `ranks` ranks and two communicators, written in an order that
// is only roughly by time: chunks are shuffled and a few calls arrive far too late. Times start below 0.
// Durations: mostly microseconds, some milliseconds, a few tens of milliseconds, some zero, many ties.
Trace writeRandomTrace(const TempDir& dir, const std::string& name, int ranks, int collectives,
                       std::uint64_t seed, bool finish = true) {
  Trace trace;
  trace.path = dir.file(name);
  std::mt19937_64 random(seed);
  const auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(random);
  };
  TraceWriter writer = TraceWriter::create(trace.path, TraceWriter::Options{/*commit_rows=*/300});
  RunInfo run;
  run.uuid = name;
  run.world_size = ranks;
  const std::int64_t run_id = writer.addRun(run);
  std::vector<std::int64_t> world(static_cast<std::size_t>(ranks)), sub(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const std::int64_t rank_id = writer.addRank({0, run_id, r, fmt::format("h{}", r), 10 + r, "cpu", 0});
    trace.rank_ids.push_back(rank_id);
    world[static_cast<std::size_t>(r)] = writer.addComm({0, rank_id, "world", Backend::Mpi, ranks, r});
    sub[static_cast<std::size_t>(r)] = writer.addComm({0, rank_id, "sub", Backend::Mpi, ranks, r});
  }
  static constexpr std::int64_t kSizes[] = {0, 1, 2, 3, 4, 1023, 1024, 4096, 65536};
  std::vector<CallRecord> calls;
  std::int64_t now = -2'000'000;
  std::int64_t seq_world = 0, seq_sub = 0;
  for (int k = 0; k < collectives; ++k) {
    const bool on_sub = uniform(0, 3) == 0;
    const std::int64_t seq = on_sub ? seq_sub++ : seq_world++;
    const int kind = static_cast<int>(uniform(0, 99));
    const Api api = kind < 70 ? Api::MpiAllreduce : kind < 90 ? Api::MpiAllgather : Api::MpiBcast;
    const std::int64_t bytes = uniform(0, 3) == 0 ? uniform(5, 64 << 20) : kSizes[uniform(0, 8)];
    const int klass = static_cast<int>(uniform(0, 99));
    now += uniform(0, 9) == 0 ? uniform(1'000'000, 10'000'000) : uniform(1'000, 200'000);
    for (int r = 0; r < ranks; ++r) {
      if (ranks > 1 && uniform(0, 19) == 0) continue;  // now and then a rank misses a collective
      CallRecord c;
      c.rank_id = trace.rank_ids[static_cast<std::size_t>(r)];
      c.comm_id = (on_sub ? sub : world)[static_cast<std::size_t>(r)];
      c.seq = seq;
      c.step = k / 20;
      c.api = api;
      c.dtype = DType::Uint8;
      c.op = api == Api::MpiAllreduce ? ReduceOp::Sum : ReduceOp::None;
      c.count = bytes;
      c.bytes = bytes;
      c.start_ns = now + uniform(0, 30'000) + (r == 1 ? 50'000 : 0);
      c.enqueue_ns = c.start_ns - uniform(0, 1'000);
      std::int64_t duration = 0;
      if (klass < 3) duration = 0;
      else if (klass < 15) duration = 5'000;  // ties
      else if (klass < 80) duration = uniform(1, 20'000);
      else if (klass < 96) duration = uniform(20'000, 2'000'000);
      else duration = uniform(5'000'000, 60'000'000);
      c.end_ns = c.start_ns + duration;
      calls.push_back(c);
    }
  }
  // Roughly in time order: shuffle within chunks of 40, then move 1% of the calls far back.
  for (std::size_t i = 0; i < calls.size(); i += 40)
    std::shuffle(calls.begin() + static_cast<std::ptrdiff_t>(i),
                 calls.begin() + static_cast<std::ptrdiff_t>(std::min(calls.size(), i + 40)), random);
  for (std::size_t moved = 0; moved < calls.size() / 100; ++moved) {
    const auto from = static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(calls.size()) / 2));
    const auto to = static_cast<std::size_t>(
        uniform(static_cast<std::int64_t>(from), static_cast<std::int64_t>(calls.size()) - 1));
    const CallRecord late = calls[from];
    calls.erase(calls.begin() + static_cast<std::ptrdiff_t>(from));
    calls.insert(calls.begin() + static_cast<std::ptrdiff_t>(to), late);
  }
  for (std::size_t i = 0; i < calls.size(); i += 64) {
    const std::span<const CallRecord> batch(calls.data() + i, std::min<std::size_t>(64, calls.size() - i));
    const std::int64_t first = writer.appendCalls(batch);
    for (std::size_t j = 0; j < batch.size(); ++j) calls[i + j].id = first + static_cast<std::int64_t>(j);
  }
  trace.calls = std::move(calls);
  if (finish)
    writer.finish();  // else the writer commits on destruction, as a crashed or running job leaves it
  return trace;
}

TimeExtent bruteExtent(const std::vector<CallRecord>& calls) {
  if (calls.empty()) return {};
  TimeExtent extent{kMax, kMin};
  for (const CallRecord& c : calls) {
    extent.begin_ns = std::min(extent.begin_ns, c.start_ns);
    extent.end_ns = std::max(extent.end_ns, c.end_ns);
  }
  return extent;
}

struct Window {
  std::int64_t t0, t1;
};

// Windows of every kind: random, tiny ones at call boundaries, zero-length, inverted, before and after
// the data, inside long calls, and everything. t0 never equals the end of a call that lasts (that
// boundary has its own test below).
std::vector<Window> makeWindows(const Trace& trace, std::uint64_t seed, int count) {
  std::mt19937_64 random(seed);
  const auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(random);
  };
  const TimeExtent extent = bruteExtent(trace.calls);
  const auto pick = [&]() -> const CallRecord& {
    return trace
        .calls[static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(trace.calls.size()) - 1))];
  };
  std::vector<Window> windows = {
      {extent.begin_ns, extent.end_ns},
      {extent.begin_ns - 1, extent.end_ns + 1},
      {-(std::int64_t{1} << 61), std::int64_t{1} << 61},  // length 2^62: no overflow
      {extent.begin_ns - 1'000'000, extent.begin_ns},     // just before the data
      {extent.end_ns + 1, extent.end_ns + 1'000'000},     // just after
      {extent.end_ns + 1'000'000'000, extent.end_ns + 2'000'000'000}};
  while (static_cast<int>(windows.size()) < count) {
    const CallRecord& c = pick();
    switch (uniform(0, 9)) {
      case 0: {
        std::int64_t a = uniform(extent.begin_ns - 10'000'000, extent.end_ns + 10'000'000);
        std::int64_t b = uniform(extent.begin_ns - 10'000'000, extent.end_ns + 10'000'000);
        windows.push_back({std::min(a, b), std::max(a, b)});
        break;
      }
      case 1: windows.push_back({c.start_ns, c.start_ns + uniform(1, 50'000)}); break;  // from a start
      case 2: windows.push_back({c.start_ns - uniform(1, 50'000), c.start_ns}); break;  // up to a start
      case 3: windows.push_back({c.end_ns - 1, c.end_ns + uniform(0, 50'000)}); break;  // around an end
      case 4: windows.push_back({c.end_ns + 1, c.end_ns + uniform(2, 50'000)}); break;  // after an end
      case 5: {
        const std::int64_t at = uniform(extent.begin_ns, extent.end_ns);
        windows.push_back({at, at});  // zero-length: empty
        break;
      }
      case 6: {
        const std::int64_t a = uniform(extent.begin_ns, extent.end_ns);
        windows.push_back({a, a - uniform(1, 1'000'000)});  // inverted: empty
        break;
      }
      case 7:  // cutting a call in the middle (long calls are the interesting ones)
        if (c.end_ns - c.start_ns > 2) {
          const std::int64_t inside = uniform(c.start_ns + 1, c.end_ns - 1);
          windows.push_back({inside, inside + uniform(1, 3'000'000)});
        }
        break;
      default: {
        const std::int64_t a = uniform(extent.begin_ns, extent.end_ns);
        windows.push_back({a, a + uniform(1, 20'000'000)});
        break;
      }
    }
  }
  // Keep the contested boundary (t0 == end of a call with a duration) out of these windows.
  std::set<std::int64_t> ends;
  for (const CallRecord& c : trace.calls)
    if (c.end_ns > c.start_ns) ends.insert(c.end_ns);
  for (Window& w : windows)
    while (ends.count(w.t0)) ++w.t0;
  return windows;
}

void expectWindowsMatchBruteForce(const Trace& trace, const TraceReader& reader, std::uint64_t seed) {
  const std::vector<Window> windows = makeWindows(trace, seed, 300);
  int failures = 0;
  std::size_t non_empty = 0;
  for (const Window& w : windows) {
    for (std::int64_t rank_id : trace.rank_ids) {
      const std::vector<std::int64_t> want = bruteWindow(trace, rank_id, w.t0, w.t1);
      const std::vector<std::int64_t> got = idsOf(reader.callsInWindow(rank_id, w.t0, w.t1));
      if (!want.empty()) ++non_empty;
      if (got != want && ++failures <= 5)
        ADD_FAILURE() << "rank " << rank_id << " window [" << w.t0 << ", " << w.t1 << "): got " << got.size()
                      << " calls, brute force " << want.size() << "\n got:  " << ::testing::PrintToString(got)
                      << "\n want: " << ::testing::PrintToString(want);
      if (want.size() > 3) {
        const std::vector<std::int64_t> limited = idsOf(reader.callsInWindow(rank_id, w.t0, w.t1, 3));
        EXPECT_EQ(limited, std::vector<std::int64_t>(want.begin(), want.begin() + 3));
      }
    }
  }
  EXPECT_EQ(failures, 0) << "of " << windows.size() * trace.rank_ids.size() << " windows";
  EXPECT_GT(non_empty, windows.size() / 3) << "the windows should mostly hit data";
}

// ---------------------------------------------------------------------------------------------------
// callsInWindow and timeExtent

class QueryRanks : public ::testing::TestWithParam<int> {};

TEST_P(QueryRanks, CallsInWindowMatchesBruteForce) {
  TempDir dir;
  const int ranks = GetParam();
  const Trace trace =
      writeRandomTrace(dir, "random.db", ranks, 2'400 / ranks, 100 + static_cast<std::uint64_t>(ranks));
  const TraceReader reader = TraceReader::open(trace.path);
  ASSERT_EQ(reader.callCount(), static_cast<std::int64_t>(trace.calls.size()));
  expectWindowsMatchBruteForce(trace, reader, 7);
  // Unknown ranks have no calls.
  EXPECT_TRUE(reader.callsInWindow(99, kMin / 2, kMax / 2).empty());
}

TEST_P(QueryRanks, CallsInWindowMatchesBruteForceWithoutFinish) {
  // Without finish() every tile level is still there (finish prunes the useless ones): the state of a
  // trace that is still being written, or whose job died.
  TempDir dir;
  const int ranks = GetParam();
  const Trace trace =
      writeRandomTrace(dir, "live.db", ranks, 1'200 / ranks, 200 + static_cast<std::uint64_t>(ranks), false);
  const TraceReader reader = TraceReader::open(trace.path);
  ASSERT_EQ(reader.callCount(), static_cast<std::int64_t>(trace.calls.size()));
  expectWindowsMatchBruteForce(trace, reader, 8);
}

TEST_P(QueryRanks, TimeExtentMatchesBruteForce) {
  TempDir dir;
  const int ranks = GetParam();
  const Trace trace =
      writeRandomTrace(dir, "random.db", ranks, 1'500 / ranks, 300 + static_cast<std::uint64_t>(ranks));
  const TimeExtent want = bruteExtent(trace.calls);
  const TimeExtent got = TraceReader::open(trace.path).timeExtent();
  EXPECT_EQ(got.begin_ns, want.begin_ns);
  EXPECT_EQ(got.end_ns, want.end_ns);
  EXPECT_LT(want.begin_ns, 0);
}

INSTANTIATE_TEST_SUITE_P(OneToThreeRanks, QueryRanks, ::testing::Values(1, 2, 3),
                         [](const auto& param_info) { return fmt::format("{}ranks", param_info.param); });

// Calls written directly: rank 0 unless stated, one communicator.
std::string writeCalls(const TempDir& dir, const std::string& name, std::vector<CallRecord> calls,
                       std::int64_t rank1_offset = 0) {
  const std::string path = dir.file(name);
  TraceWriter writer = TraceWriter::create(path);
  RunInfo run;
  run.uuid = name;
  const std::int64_t run_id = writer.addRun(run);
  writer.addRank({0, run_id, 0, "h0", 1, "cpu", 0});
  writer.addRank({0, run_id, 1, "h1", 2, "cpu", rank1_offset});
  writer.addComm({0, 0, "world", Backend::Mpi, 2, 0});
  writer.addComm({0, 1, "world", Backend::Mpi, 2, 1});
  for (CallRecord& c : calls)
    if (c.comm_id == 0) c.comm_id = c.rank_id + 1;
  writer.appendCalls(calls);
  writer.finish();
  return path;
}

CallRecord span(std::int64_t start, std::int64_t end, std::int64_t rank_id = 0, std::int64_t bytes = 8) {
  CallRecord c;
  c.rank_id = rank_id;
  c.api = Api::MpiAllreduce;
  c.dtype = DType::Fp32;
  c.op = ReduceOp::Sum;
  c.count = bytes / 4;
  c.bytes = bytes;
  c.enqueue_ns = start;
  c.start_ns = start;
  c.end_ns = end;
  return c;
}

// BUG: storage/src/reader.cc callsInWindow filters with `c.end_ns >= t0`, so a call that ends exactly
// where the window starts is returned although it does not overlap [t0, t1) (header: "end > t0").
TEST(CallsInWindow, ACallEndingExactlyAtTheWindowStartIsOutsideIt) {
  TempDir dir;
  const std::string path = writeCalls(dir, "edges.db", {span(100, 200), span(300, 400)});
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 200, 300)), std::vector<std::int64_t>{});
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 400, 500)), std::vector<std::int64_t>{});
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 199, 300)), std::vector<std::int64_t>{1});
}

TEST(CallsInWindow, HalfOpenBoundariesAndZeroLengthCalls) {
  TempDir dir;
  const std::string path = writeCalls(dir, "edges.db", {span(100, 200), span(250, 250), span(300, 400)});
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 0, 100)), std::vector<std::int64_t>{});  // starts at t1: outside
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 0, 101)), std::vector<std::int64_t>{1});
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 250, 260)),
            std::vector<std::int64_t>{2});  // an instant in the window
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 240, 250)), std::vector<std::int64_t>{});
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 240, 251)), std::vector<std::int64_t>{2});
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 150, 350)), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 350, 350)), std::vector<std::int64_t>{});  // zero-length window
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 350, 310)), std::vector<std::int64_t>{});  // inverted window
  EXPECT_EQ(idsOf(reader.callsInWindow(1, 0, 1000)), std::vector<std::int64_t>{});   // rank without calls
}

// BUG: storage/src/reader.cc callsInWindow computes `t0_ns - impl_->maxDuration(rank_id)`, which
// overflows (undefined behaviour) for a window starting at INT64_MIN; in practice it wraps and the
// "everything" window returns no calls at all. timeline() has the same subtraction.
TEST(CallsInWindow, TheWholeInt64RangeReturnsEveryCall) {
  TempDir dir;
  const std::string path =
      writeCalls(dir, "all.db", {span(-5, 200), span(300, 400), span(1'000'000, 1'000'001)});
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(idsOf(reader.callsInWindow(0, kMin, kMax)), (std::vector<std::int64_t>{1, 2, 3}));
}

// callWindow (window.h) looks back as far as a tile that may hold a call still running at t0, and no
// further: not one tile (which misses a long call) and not the longest call's duration.
TEST(CallWindow, LooksBackAsFarAsACallThatStillRuns) {
  TempDir dir;
  std::vector<CallRecord> calls = {span(0, 100'000'000)};  // id 1: 100 ms
  for (std::int64_t i = 0; i < 400; ++i)
    calls.push_back(span(i * 500'000, i * 500'000 + 10'000));  // ids 2..401: 10 µs every 0.5 ms
  const TraceReader reader = TraceReader::open(writeCalls(dir, "lookback.db", calls));
  // 90 ms is 22 finest tiles into the long call: its id opens the range.
  const CallWindow during = reader.callWindow(90'000'000, 91'000'000, 0);
  ASSERT_EQ(during.ids.size(), 1u);
  EXPECT_EQ(during.ids[0].first_id, 1);
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 90'000'000, 91'000'000)), (std::vector<std::int64_t>{1, 182, 183}));
  // At 150 ms the long call is over: the range starts in t0's own tile, although the rank's longest call
  // would reach back to 50 ms.
  const CallWindow after = reader.callWindow(150'000'000, 151'000'000);
  ASSERT_EQ(after.ids.size(), 1u);
  EXPECT_EQ(after.ids[0].rank_id, 0);
  const std::int64_t tile_start = (std::int64_t{150'000'000} >> kTileLevels[0]) << kTileLevels[0];
  EXPECT_EQ(after.ids[0].first_id, 2 + (tile_start + 499'999) / 500'000);
  EXPECT_EQ(idsOf(reader.callsInWindow(0, 150'000'000, 151'000'000)), (std::vector<std::int64_t>{302, 303}));
  EXPECT_TRUE(reader.callWindow(150'000'000, 151'000'000, 1).empty());  // rank 1 has no calls
  EXPECT_TRUE(reader.callWindow(151'000'000, 150'000'000).empty());     // inverted
}

TEST(CallWindow, SqlConditionJoinsTouchingRanges) {
  const CallWindow window{0, 10, std::nullopt, {{0, 1, 10}, {1, 11, 20}, {2, 30, 40}}};
  EXPECT_EQ(window.sqlCondition("c"),
            "(c.id BETWEEN 1 AND 20 OR c.id BETWEEN 30 AND 40) AND c.start_ns < 10 AND (c.end_ns > 0 OR "
            "c.start_ns >= 0)");
  const CallWindow one{kMin, 10, 1, {{1, 11, 20}}};
  EXPECT_EQ(one.sqlCondition("k"),
            "(k.id BETWEEN 11 AND 20) AND k.start_ns < 10 AND (k.end_ns > (-9223372036854775807 - 1) OR "
            "k.start_ns >= (-9223372036854775807 - 1)) AND k.rank_id = 1");
  EXPECT_EQ(CallWindow{}.sqlCondition("c"), "0");
  EXPECT_TRUE(inWindow(5, 5, 5, 6));     // an instant at t0
  EXPECT_FALSE(inWindow(4, 5, 5, 6));    // ends at t0
  EXPECT_TRUE(inWindow(-100, 6, 5, 6));  // started long before, still running
  EXPECT_FALSE(inWindow(6, 7, 5, 6));    // starts at t1
}

TEST(TimeExtent, EmptyTraceAndNegativeTimes) {
  TempDir dir;
  const std::string empty = dir.file("empty.db");
  TraceWriter::create(empty).finish();
  EXPECT_TRUE(TraceReader::open(empty).timeExtent().empty());

  const std::string path =
      writeCalls(dir, "negative.db", {span(-900, -800), span(-1'000, -950, 1), span(-10, -1)});
  const TimeExtent extent = TraceReader::open(path).timeExtent();
  EXPECT_EQ(extent.begin_ns, -1'000);
  EXPECT_EQ(extent.end_ns, -1);
}

// ---------------------------------------------------------------------------------------------------
// timeline(): the raw path (few calls in the window)

// Columns of the window that a call starting at `start` is counted in, as timeline() computes it.
std::int64_t columnOf(std::int64_t start, std::int64_t t0, double width) {
  return static_cast<std::int64_t>(static_cast<double>(start - t0) / width);
}

TEST(Timeline, RawPathMatchesBruteForce) {
  TempDir dir;
  const Trace trace = writeRandomTrace(dir, "random.db", 3, 600, 11);
  const TraceReader reader = TraceReader::open(trace.path);
  const std::vector<Window> windows = makeWindows(trace, 12, 200);
  int raw_windows = 0;
  for (const Window& w : windows) {
    if (w.t1 <= w.t0) {
      const TimelineSummary empty = reader.timeline(w.t0, w.t1, 10);
      EXPECT_TRUE(empty.buckets.empty());
      continue;
    }
    for (const int columns : {1, 10, 150}) {
      const TimelineSummary summary = reader.timeline(w.t0, w.t1, columns);
      SCOPED_TRACE(fmt::format("window [{}, {}) columns {}", w.t0, w.t1, columns));
      ASSERT_EQ(summary.rank_ids, trace.rank_ids);
      ASSERT_EQ(summary.columns, columns);
      ASSERT_EQ(summary.buckets.size(), trace.rank_ids.size());
      if (summary.level >= 0) continue;  // the tile path: tested on the large trace below
      ++raw_windows;
      const double width = static_cast<double>(w.t1 - w.t0) / columns;
      for (std::size_t r = 0; r < trace.rank_ids.size(); ++r) {
        const std::vector<TimelineBucket>& row = summary.buckets[r];
        ASSERT_EQ(row.size(), static_cast<std::size_t>(columns));
        std::vector<TimelineBucket> want(static_cast<std::size_t>(columns));
        std::int64_t overlap_ns = 0, pieces = 0, straddling_calls = 0, straddling_bytes = 0;
        for (const CallRecord& c : trace.calls) {
          if (c.rank_id != trace.rank_ids[r] || !overlaps(c, w.t0, w.t1)) continue;
          const std::int64_t overlap = std::min(c.end_ns, w.t1) - std::max(c.start_ns, w.t0);
          overlap_ns += overlap;
          pieces += static_cast<std::int64_t>(static_cast<double>(overlap) / width) + 2;
          if (c.start_ns < w.t0) {
            ++straddling_calls;
            straddling_bytes += c.bytes;
            continue;
          }
          const std::int64_t column = columnOf(c.start_ns, w.t0, width);
          if (column >= columns) continue;  // rounding put it past the last column: timeline() drops it too
          TimelineBucket& bucket = want[static_cast<std::size_t>(column)];
          ++bucket.calls;
          bucket.bytes += c.bytes;
          bucket.max_ns = std::max(bucket.max_ns, c.end_ns - c.start_ns);
        }
        // Calls, bytes and the longest call per column: exact, except that column 0 may also count the
        // calls that started before the window (see CountsOnlyCallsStartingInTheWindow).
        for (std::size_t col = 1; col < row.size(); ++col) {
          EXPECT_EQ(row[col].calls, want[col].calls) << "column " << col << " rank " << trace.rank_ids[r];
          EXPECT_EQ(row[col].bytes, want[col].bytes) << "column " << col;
          EXPECT_EQ(row[col].max_ns, want[col].max_ns) << "column " << col;
        }
        EXPECT_GE(row[0].calls, want[0].calls);
        EXPECT_LE(row[0].calls, want[0].calls + straddling_calls);
        EXPECT_GE(row[0].bytes, want[0].bytes);
        EXPECT_LE(row[0].bytes, want[0].bytes + straddling_bytes);
        // Busy time: the overlap of every call with the window, spread over the columns it covers;
        // each column's share is truncated to whole nanoseconds.
        std::int64_t busy = 0;
        for (const TimelineBucket& bucket : row) {
          busy += bucket.busy_ns;
          EXPECT_GE(bucket.busy_ns, 0);
          if (bucket.busy_ns > 0) {
            EXPECT_NE(bucket.dominant_api, Api::Unknown);
          }
        }
        EXPECT_LE(busy, overlap_ns);
        EXPECT_GE(busy, overlap_ns - pieces) << "busy time lost beyond rounding";
      }
    }
  }
  EXPECT_GT(raw_windows, 100);
}

// BUG (or an undocumented choice; the brief expects "calls starting in the window"): the raw path of
// timeline() (storage/src/reader.cc, lambda `add`) counts a call that started before t0 in column 0
// (calls, bytes, max_ns), and so does a call that ended exactly at t0 (via the callsInWindow boundary
// bug). Adjacent windows then count such a call twice. TimelineBucket's header says busy_ns sums "the
// calls starting in the bucket", so calls/bytes/max_ns should too; busy time is spread (see above).
TEST(Timeline, CountsOnlyCallsStartingInTheWindow) {
  TempDir dir;
  const std::string path = writeCalls(
      dir, "straddle.db", {span(0, 1'000, 0, 16), span(100, 1'100, 0, 32), span(1'500, 1'600, 0, 64)});
  const TraceReader reader = TraceReader::open(path);
  const TimelineSummary summary = reader.timeline(1'000, 2'000, 10);
  ASSERT_EQ(summary.level, -1);
  ASSERT_EQ(summary.rank_ids, (std::vector<std::int64_t>{0, 1}));
  const auto& row = summary.buckets[0];
  std::int64_t calls = 0, bytes = 0, busy = 0;
  for (const TimelineBucket& bucket : row) {
    calls += bucket.calls;
    bytes += bucket.bytes;
    busy += bucket.busy_ns;
  }
  EXPECT_EQ(busy, 100 + 100);  // the tail of the second call and the whole third one
  EXPECT_EQ(row[5].calls, 1);
  EXPECT_EQ(calls, 1) << "only the call starting at 1500 starts in [1000, 2000)";
  EXPECT_EQ(bytes, 64);
  EXPECT_EQ(row[0].max_ns, 0);
}

TEST(Timeline, DominantApiIsTheOneWithMostBusyTime) {
  TempDir dir;
  CallRecord gather = span(0, 300);
  gather.api = Api::MpiAllgather;
  CallRecord small = span(300, 400);
  CallRecord bcast = span(600, 1'000);
  bcast.api = Api::MpiBcast;
  const std::string path = writeCalls(dir, "dominant.db", {gather, small, bcast, span(500, 520)});
  const TimelineSummary summary = TraceReader::open(path).timeline(0, 1'000, 2);
  ASSERT_EQ(summary.level, -1);
  const auto& row = summary.buckets.at(0);
  EXPECT_EQ(row[0].calls, 2);
  EXPECT_EQ(row[0].busy_ns, 400);
  EXPECT_EQ(row[0].dominant_api, Api::MpiAllgather);  // 300 ns against 100 ns
  EXPECT_EQ(row[1].calls, 2);
  EXPECT_EQ(row[1].busy_ns, 420);
  EXPECT_EQ(row[1].max_ns, 400);
  EXPECT_EQ(row[1].dominant_api, Api::MpiBcast);
  EXPECT_EQ(summary.buckets.at(1)[0].calls, 0);  // rank 1 has no calls
  EXPECT_EQ(summary.buckets.at(1)[0].dominant_api, Api::Unknown);
}

TEST(Timeline, DegenerateRequests) {
  TempDir dir;
  const std::string path = writeCalls(dir, "t.db", {span(0, 10)});
  const TraceReader reader = TraceReader::open(path);
  for (const auto& [t0, t1, columns] : std::vector<std::tuple<std::int64_t, std::int64_t, int>>{
           {0, 100, 0}, {0, 100, -3}, {100, 100, 10}, {100, 0, 10}}) {
    const TimelineSummary summary = reader.timeline(t0, t1, columns);
    EXPECT_TRUE(summary.buckets.empty());
    EXPECT_EQ(summary.level, -1);
  }
}

// ---------------------------------------------------------------------------------------------------
// timeline(): the tile path, on a trace large enough to use it

class LargeTrace : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    path_ = dir_->file("large.db");
    calls_ = testing::manyCalls(200'000, 0, 1, 42);
    TraceWriter writer = TraceWriter::create(path_);
    RunInfo run;
    run.uuid = "large";
    writer.addRun(run);
    writer.addRank({0, 1, 0, "h", 1, "cpu", 0});
    writer.addComm({0, 0, "world", Backend::Mpi, 1, 0});
    const std::int64_t first = writer.appendCalls(calls_);
    for (std::size_t i = 0; i < calls_.size(); ++i) calls_[i].id = first + static_cast<std::int64_t>(i);
    writer.finish();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    calls_.clear();
  }

  static TempDir* dir_;
  static std::string path_;
  static std::vector<CallRecord> calls_;
};

TempDir* LargeTrace::dir_ = nullptr;
std::string LargeTrace::path_;
std::vector<CallRecord> LargeTrace::calls_;

TEST_F(LargeTrace, TilePathConservesCallsAndBusyTime) {
  const TraceReader reader = TraceReader::open(path_);
  const TimeExtent extent = reader.timeExtent();
  ASSERT_EQ(extent.begin_ns, calls_.front().start_ns);
  ASSERT_EQ(extent.end_ns, calls_.back().end_ns);
  // From 0 (aligned to every tile) to past the end: every tile lies inside the window.
  const int columns = 100;
  const TimelineSummary summary = reader.timeline(0, extent.end_ns + 1, columns);
  ASSERT_GE(summary.level, 0) << "this window should be served from call_tiles";
  ASSERT_EQ(summary.buckets.size(), 1u);
  const auto& row = summary.buckets[0];
  std::int64_t calls = 0, busy = 0, bytes = 0, want_busy = 0, want_bytes = 0, longest = 0;
  for (const TimelineBucket& bucket : row) {
    calls += bucket.calls;
    busy += bucket.busy_ns;
    bytes += bucket.bytes;
    longest = std::max(longest, bucket.max_ns);
  }
  std::int64_t want_longest = 0;
  for (const CallRecord& c : calls_) {
    want_busy += c.end_ns - c.start_ns;
    want_bytes += c.bytes;
    want_longest = std::max(want_longest, c.end_ns - c.start_ns);
  }
  const double width = static_cast<double>(extent.end_ns + 1) / columns;
  EXPECT_EQ(calls, 200'000);
  EXPECT_EQ(bytes, want_bytes);
  EXPECT_EQ(longest, want_longest);
  // Truncation loses under 1 ns per (tile, column) piece.
  // Truncation loses under 1 ns per piece: a tile row (two APIs per tile) spread over the columns it covers.
  const std::int64_t rows =
      2 * (static_cast<std::int64_t>(std::ldexp(static_cast<double>(extent.end_ns), -summary.level)) + 2);
  EXPECT_LE(busy, want_busy);
  EXPECT_GE(busy, want_busy - 2 * rows - static_cast<std::int64_t>(static_cast<double>(want_busy) / width) -
                      columns);

  // A tile is placed at its start, at most one tile width before its calls: counts per column can only
  // move earlier, by less than a tile.
  const double tile = std::ldexp(1.0, summary.level);
  ASSERT_LE(tile, width);
  std::int64_t counted = 0;
  for (int col = 0; col < columns; ++col) {
    counted += row[static_cast<std::size_t>(col)].calls;
    const double boundary = width * (col + 1);
    std::int64_t before = 0, near = 0;
    for (const CallRecord& c : calls_) {
      before += static_cast<double>(c.start_ns) < boundary ? 1 : 0;
      near += static_cast<double>(c.start_ns) >= boundary - 1 &&
              static_cast<double>(c.start_ns) < boundary + tile + 1;
    }
    EXPECT_GE(counted, before - near) << "column " << col;
    EXPECT_LE(counted, before + near) << "column " << col;
  }
}

TEST_F(LargeTrace, TilePathBusyTimeInAnInteriorWindowIsWithinTheEdgeTiles) {
  const TraceReader reader = TraceReader::open(path_);
  const TimeExtent extent = reader.timeExtent();
  const std::int64_t t0 = extent.begin_ns + (extent.end_ns - extent.begin_ns) / 5 + 12'345;
  const std::int64_t t1 = extent.end_ns - (extent.end_ns - extent.begin_ns) / 5 - 999;
  const TimelineSummary summary = reader.timeline(t0, t1, 50);
  ASSERT_GE(summary.level, 0);
  const std::int64_t tile = std::int64_t{1} << summary.level;
  std::int64_t busy = 0, calls = 0;
  for (const TimelineBucket& bucket : summary.buckets.at(0)) {
    busy += bucket.busy_ns;
    calls += bucket.calls;
  }
  // Exact values, and what the tiles at the two edges can get wrong: their calls' durations.
  std::int64_t want_busy = 0, want_calls = 0, edge_busy = 0, edge_calls = 0, longest = 0;
  for (const CallRecord& c : calls_) longest = std::max(longest, c.end_ns - c.start_ns);
  for (const CallRecord& c : calls_) {
    if (overlaps(c, t0, t1)) want_busy += std::min(c.end_ns, t1) - std::max(c.start_ns, t0);
    if (c.start_ns >= t0 && c.start_ns < t1) ++want_calls;
    for (const std::int64_t edge : {t0, t1})
      if (c.start_ns > edge - tile - longest && c.start_ns < edge + tile) {
        edge_busy += c.end_ns - c.start_ns;
        ++edge_calls;
      }
  }
  const std::int64_t rounding =
      4 * ((t1 - t0) / tile + 2) + 2 * 50;  // under 1 ns per (tile row, column) piece
  EXPECT_NEAR(static_cast<double>(busy), static_cast<double>(want_busy),
              static_cast<double>(edge_busy + rounding));
  EXPECT_NEAR(static_cast<double>(calls), static_cast<double>(want_calls), static_cast<double>(edge_calls));
  EXPECT_LT(edge_busy, want_busy / 10) << "the bound should be meaningful";
}

TEST_F(LargeTrace, CallsInWindowAndRawTimelineOnALargeTrace) {
  const TraceReader reader = TraceReader::open(path_);
  std::mt19937_64 random(5);
  const std::int64_t end = calls_.back().end_ns;
  for (int i = 0; i < 40; ++i) {
    const std::int64_t t0 = std::uniform_int_distribution<std::int64_t>(0, end)(random);
    const std::int64_t t1 = t0 + std::uniform_int_distribution<std::int64_t>(1, 3'000'000)(random);
    // Calls are sorted by start and do not overlap: the window's calls are a contiguous run.
    std::vector<std::int64_t> want;
    for (const CallRecord& c : calls_)
      if (c.start_ns < t1 && c.end_ns > t0) want.push_back(c.id);
    EXPECT_EQ(idsOf(reader.callsInWindow(0, t0, t1)), want) << "[" << t0 << ", " << t1 << ")";
    const TimelineSummary summary = reader.timeline(t0, t1, 20);
    std::int64_t busy = 0;
    for (const TimelineBucket& bucket : summary.buckets.at(0)) busy += bucket.busy_ns;
    std::int64_t want_busy = 0;
    for (const CallRecord& c : calls_)
      if (c.start_ns < t1 && c.end_ns > t0) want_busy += std::min(c.end_ns, t1) - std::max(c.start_ns, t0);
    if (summary.level < 0) {
      EXPECT_LE(busy, want_busy);
      EXPECT_GE(busy, want_busy - static_cast<std::int64_t>(want.size()) * 2 - 20);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// call_tiles levels: one whose tiles hold fewer than two calls is no longer written once 2^18 calls
// (storage/src/tiles.h, kDecideAfterCalls) have shown it, and the rows stored before are deleted.

constexpr std::int64_t kDecideAfterCalls = std::int64_t{1} << 18;

// `count` calls of rank 0, `spacing_ns` apart, each 1 µs long, written in commits of 10,000 calls (an
// agent's flushes, so that rows of the finest level are stored before the decision). Calls `probe` (the
// tile levels stored, finest first) after every commit.
std::vector<CallRecord> writeSpacedCalls(const std::string& path, std::int64_t count, std::int64_t spacing_ns,
                                         const std::function<void(std::int64_t, int)>& probe) {
  std::vector<CallRecord> calls = testing::manyCalls(static_cast<std::size_t>(count), 0, 1, 11);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    calls[i].start_ns = static_cast<std::int64_t>(i) * spacing_ns;
    calls[i].end_ns = calls[i].start_ns + 1000;
  }
  TraceWriter writer = TraceWriter::create(path);
  RunInfo run;
  run.uuid = "tiles";
  writer.addRun(run);
  writer.addRank({0, 1, 0, "h", 1, "cpu", 0});
  writer.addComm({0, 0, "world", Backend::Mpi, 1, 0});
  for (std::size_t at = 0; at < calls.size(); at += 10'000) {
    const std::size_t n = std::min<std::size_t>(10'000, calls.size() - at);
    const std::int64_t first = writer.appendCalls(std::span<const CallRecord>(calls).subspan(at, n));
    for (std::size_t i = 0; i < n; ++i) calls[at + i].id = first + static_cast<std::int64_t>(i);
    writer.commit();
    test::RawDb db(path, SQLITE_OPEN_READONLY);
    probe(static_cast<std::int64_t>(at + n),
          static_cast<int>(db.integer("SELECT min(level) FROM call_tiles")));
  }
  writer.finish();
  return calls;
}

TEST(TileLevels, ALevelOfATileForNearlyEveryCallIsDroppedAfterTheDecision) {
  TempDir dir;
  const std::string path = dir.file("sparse.db");
  // 5 ms apart: every call has its own 4 ms tile (level 22); a 67 ms tile (26) holds 13 of them.
  int finest_before = -1, finest_after = -1;
  const auto calls =
      writeSpacedCalls(path, kDecideAfterCalls + 40'000, 5'000'000, [&](std::int64_t written, int finest) {
        (written < kDecideAfterCalls ? finest_before : finest_after) = finest;
      });
  EXPECT_EQ(finest_before, kTileLevels[0]) << "rows of the finest level are stored before the decision";
  EXPECT_EQ(finest_after, kTileLevels[1]) << "and deleted at the commit that decides";
  test::RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("SELECT count(*) FROM call_tiles WHERE level = " + std::to_string(kTileLevels[0])), 0);
  // The coarser levels count every call, and the time index still finds exactly the window's calls.
  for (std::size_t l = 1; l < std::size(kTileLevels); ++l)
    EXPECT_EQ(db.integer("SELECT coalesce(sum(calls), 0) FROM call_tiles WHERE level = " +
                         std::to_string(kTileLevels[l])),
              static_cast<std::int64_t>(calls.size()))
        << "level " << kTileLevels[l];
  const TraceReader reader = TraceReader::open(path);
  std::mt19937_64 random(3);
  const std::int64_t end = calls.back().end_ns;
  for (int i = 0; i < 30; ++i) {
    const std::int64_t t0 = std::uniform_int_distribution<std::int64_t>(0, end)(random);
    const std::int64_t t1 = t0 + std::uniform_int_distribution<std::int64_t>(1, 200'000'000)(random);
    std::vector<std::int64_t> want;
    for (const CallRecord& c : calls)
      if (c.start_ns < t1 && c.end_ns > t0) want.push_back(c.id);
    EXPECT_EQ(idsOf(reader.callsInWindow(0, t0, t1)), want) << "[" << t0 << ", " << t1 << ")";
  }
}

TEST(TileLevels, ALevelWhoseTilesHoldSeveralCallsIsKept) {
  TempDir dir;
  const std::string path = dir.file("dense.db");
  // 250 µs apart: 16 calls to a 4 ms tile, 8 of each of the two APIs manyCalls mixes.
  int finest_after = -1;
  writeSpacedCalls(path, kDecideAfterCalls + 40'000, 250'000, [&](std::int64_t written, int finest) {
    if (written > kDecideAfterCalls) finest_after = finest;
  });
  EXPECT_EQ(finest_after, kTileLevels[0]);
  test::RawDb db(path, SQLITE_OPEN_READONLY);
  EXPECT_EQ(db.integer("SELECT min(level) FROM call_tiles"), kTileLevels[0]);
}

// ---------------------------------------------------------------------------------------------------
// callStatistics, lateness and the size histogram

TEST(CallStatistics, MatchesBruteForce) {
  TempDir dir;
  const Trace trace = writeRandomTrace(dir, "random.db", 3, 700, 21);
  const TraceReader reader = TraceReader::open(trace.path);
  const auto stats = reader.callStatistics(25);

  std::map<std::pair<int, int>, SizeBucket> sizes;
  std::map<std::int64_t, RankSummary> ranks;
  for (const CallRecord& c : trace.calls) {
    const std::int64_t d = c.end_ns - c.start_ns;
    const int log2 =
        c.bytes > 0 ? static_cast<int>(std::bit_width(static_cast<std::uint64_t>(c.bytes))) - 1 : -1;
    SizeBucket& s = sizes[{static_cast<int>(c.api), log2}];
    if (s.calls == 0) {
      s.api = c.api;
      s.log2_bytes = log2;
      s.min_ns = d;
    }
    ++s.calls;
    s.total_ns += d;
    s.bytes += c.bytes;
    s.min_ns = std::min(s.min_ns, d);
    s.max_ns = std::max(s.max_ns, d);
    RankSummary& r = ranks[c.rank_id];
    if (r.calls == 0) {
      r.first_ns = c.start_ns;
      r.last_ns = c.end_ns;
    }
    ++r.calls;
    r.total_ns += d;
    r.first_ns = std::min(r.first_ns, c.start_ns);
    r.last_ns = std::max(r.last_ns, c.end_ns);
  }
  ASSERT_EQ(stats.sizes.size(), sizes.size());
  std::size_t i = 0;
  for (const auto& [key, want] : sizes) {
    const SizeBucket& got = stats.sizes[i++];
    SCOPED_TRACE(fmt::format("api {} log2 {}", key.first, key.second));
    EXPECT_EQ(got.api, want.api);
    EXPECT_EQ(got.log2_bytes, want.log2_bytes);
    EXPECT_EQ(got.calls, want.calls);
    EXPECT_EQ(got.total_ns, want.total_ns);
    EXPECT_EQ(got.min_ns, want.min_ns);
    EXPECT_EQ(got.max_ns, want.max_ns);
    EXPECT_EQ(got.bytes, want.bytes);
  }
  ASSERT_EQ(stats.ranks.size(), 3u);
  for (const RankSummary& got : stats.ranks) {
    const RankSummary& want = ranks.at(got.rank_id);
    EXPECT_EQ(got.rank, static_cast<int>(got.rank_id));
    EXPECT_EQ(got.host, fmt::format("h{}", got.rank_id));
    EXPECT_EQ(got.calls, want.calls);
    EXPECT_EQ(got.total_ns, want.total_ns);
    EXPECT_EQ(got.first_ns, want.first_ns);
    EXPECT_EQ(got.last_ns, want.last_ns);
    // busy_ns: the union of the rank's call intervals, computed here by sorting them.
    std::vector<std::pair<std::int64_t, std::int64_t>> intervals;
    for (const CallRecord& c : trace.calls)
      if (c.rank_id == got.rank_id) intervals.emplace_back(c.start_ns, c.end_ns);
    std::sort(intervals.begin(), intervals.end());
    std::int64_t busy = 0, reach = std::numeric_limits<std::int64_t>::min();
    for (const auto& [start, end] : intervals) {
      if (end > reach) busy += end - std::max(start, reach);
      reach = std::max(reach, end);
    }
    EXPECT_EQ(got.busy_ns, busy);
    EXPECT_LE(got.busy_ns, got.total_ns);
    EXPECT_LE(got.busy_ns, got.last_ns - got.first_ns);
  }
  // Longest first; equal durations in id order.
  std::vector<CallRecord> sorted = trace.calls;
  std::sort(sorted.begin(), sorted.end(), [](const CallRecord& a, const CallRecord& b) {
    const std::int64_t da = a.end_ns - a.start_ns, db = b.end_ns - b.start_ns;
    return da != db ? da > db : a.id < b.id;
  });
  sorted.resize(25);
  EXPECT_EQ(idsOf(stats.longest), idsOf(sorted));
  EXPECT_TRUE(reader.callStatistics(0).longest.empty());
}

// A nonblocking all-reduce recorded at its completion, after the calls that ran while it was in flight:
// the time in collectives counts each call, the busy time counts the overlap once.
TEST(CallStatistics, BusyTimeCountsOverlappingCallsOnce) {
  TempDir dir;
  std::vector<CallRecord> calls = {span(0, 100), span(120, 200), span(250, 300), span(50, 400),
                                   span(500, 510)};
  // And far more disjoint calls than the union keeps open, each with a call spanning the previous one.
  for (std::int64_t i = 0; i < 2000; ++i) {
    const std::int64_t t = 1000 + i * 100;
    calls.push_back(span(t, t + 40));
    if (i % 7 == 6) calls.push_back(span(t - 150, t + 60));
  }
  std::int64_t total = 0;
  for (const CallRecord& c : calls) total += c.end_ns - c.start_ns;
  const std::string path = writeCalls(dir, "overlap.db", calls);
  const auto stats = TraceReader::open(path).callStatistics(0);
  ASSERT_EQ(stats.ranks.size(), 2u);
  const RankSummary& rank = stats.ranks[0];
  EXPECT_EQ(rank.total_ns, total);
  // [0, 400] and [500, 510]; then per group of 7 starting at i: calls [t, t + 40] with t = 1000 + 100 i, of
  // which the 7th's companion [t - 150, t + 60] joins the 6th and the 7th into [t - 150, t + 60].
  std::int64_t want = 400 + 10;
  for (std::int64_t i = 0; i < 2000; ++i) want += i % 7 == 5 ? 0 : i % 7 == 6 ? 210 : 40;
  EXPECT_EQ(rank.busy_ns, want);
}

TEST(CallStatistics, LongestCallsBreakTiesByIdAndKeepTheirFields) {
  TempDir dir;
  CallRecord gpu = span(10, 40, 1, 64);
  gpu.stream = 3;
  gpu.nccl_algo = 1;
  const std::string path =
      writeCalls(dir, "ties.db", {span(0, 10), span(20, 50), gpu, span(60, 90), span(100, 105)});
  const TraceReader reader = TraceReader::open(path);
  EXPECT_EQ(idsOf(reader.callStatistics(2).longest), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(idsOf(reader.callStatistics(3).longest), (std::vector<std::int64_t>{2, 3, 4}));
  const auto all = reader.callStatistics(100).longest;
  EXPECT_EQ(idsOf(all), (std::vector<std::int64_t>{2, 3, 4, 1, 5}));
  EXPECT_EQ(test::describe(all[1]), test::describe([&] {
              CallRecord c = gpu;
              c.id = 3;
              c.comm_id = 2;
              return c;
            }()));
}

TEST(CallStatistics, RanksWithoutCallsAreListed) {
  TempDir dir;
  const std::string path = writeCalls(dir, "one.db", {span(0, 10)});
  const auto stats = TraceReader::open(path).callStatistics(5);
  ASSERT_EQ(stats.ranks.size(), 2u);
  EXPECT_EQ(stats.ranks[0].calls, 1);
  EXPECT_EQ(stats.ranks[1].calls, 0);
  EXPECT_EQ(stats.ranks[1].host, "h1");
}

TEST(SizeHistogram, Log2BucketsOfBytes) {
  TempDir dir;
  std::vector<CallRecord> calls;
  for (const std::int64_t bytes : {0, 1, 2, 3, 4, 1023, 1024, 1025, 2047, 2048})
    calls.push_back(span(static_cast<std::int64_t>(calls.size()) * 100,
                         static_cast<std::int64_t>(calls.size()) * 100 + 10 + bytes % 7, 0, bytes));
  CallRecord gather = span(5'000, 5'010, 0, 1024);
  gather.api = Api::MpiAllgather;
  calls.push_back(gather);
  const std::string path = writeCalls(dir, "sizes.db", calls);
  const auto sizes = TraceReader::open(path).callStatistics(0).sizes;
  std::vector<std::tuple<Api, int, std::int64_t, std::int64_t>> got;
  for (const SizeBucket& s : sizes) got.emplace_back(s.api, s.log2_bytes, s.calls, s.bytes);
  EXPECT_EQ(got, (std::vector<std::tuple<Api, int, std::int64_t, std::int64_t>>{
                     {Api::MpiAllreduce, -1, 1, 0},
                     {Api::MpiAllreduce, 0, 1, 1},
                     {Api::MpiAllreduce, 1, 2, 5},
                     {Api::MpiAllreduce, 2, 1, 4},
                     {Api::MpiAllreduce, 9, 1, 1023},
                     {Api::MpiAllreduce, 10, 3, 1024 + 1025 + 2047},
                     {Api::MpiAllreduce, 11, 1, 2048},
                     {Api::MpiAllgather, 10, 1, 1024}}));
}

std::vector<TraceReader::Lateness> bruteLateness(const TraceReader& reader) {
  std::map<std::int64_t, std::pair<std::int64_t, std::string>> comm;  // id -> (run, key)
  std::map<std::int64_t, std::int64_t> run_of, offset_of;
  for (const RankInfo& r : reader.ranks()) {
    run_of[r.id] = r.run_id;
    offset_of[r.id] = r.clock_offset_ns;
  }
  for (const CommInfo& c : reader.comms()) comm[c.id] = {run_of.at(c.rank_id), c.key};
  std::vector<CallRecord> calls;
  reader.forEachCall([&](const CallRecord& c) {
    calls.push_back(c);
    return true;
  });
  // Times aligned to rank 0 with each rank's clock offset (records.h).
  const auto aligned = [&](const CallRecord& c) { return c.start_ns + offset_of.at(c.rank_id); };
  std::map<std::tuple<std::int64_t, std::string, std::int64_t>, std::pair<std::int64_t, int>> first;
  for (const CallRecord& c : calls) {
    const auto& [run, key] = comm.at(c.comm_id);
    auto [it, fresh] = first.try_emplace({run, key, c.seq}, aligned(c), 0);
    it->second.first = std::min(it->second.first, aligned(c));
    ++it->second.second;
  }
  std::map<std::int64_t, TraceReader::Lateness> per_rank;
  for (const CallRecord& c : calls) {
    const auto& [run, key] = comm.at(c.comm_id);
    const auto& [earliest, count] = first.at({run, key, c.seq});
    if (count < 2) continue;
    TraceReader::Lateness& late = per_rank[c.rank_id];
    late.rank_id = c.rank_id;
    ++late.matched;
    late.mean_ns += static_cast<double>(aligned(c) - earliest);
    late.max_ns = std::max(late.max_ns, aligned(c) - earliest);
  }
  std::vector<TraceReader::Lateness> out;
  for (auto& [id, late] : per_rank) {
    late.mean_ns /= static_cast<double>(late.matched);
    out.push_back(late);
  }
  return out;
}

void expectLatenessEqual(const std::vector<TraceReader::Lateness>& got,
                         const std::vector<TraceReader::Lateness>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(fmt::format("rank id {}", want[i].rank_id));
    EXPECT_EQ(got[i].rank_id, want[i].rank_id);
    EXPECT_EQ(got[i].matched, want[i].matched);
    EXPECT_NEAR(got[i].mean_ns, want[i].mean_ns, 1e-6 * std::max(1.0, want[i].mean_ns));
    EXPECT_EQ(got[i].max_ns, want[i].max_ns);
  }
}

TEST(Lateness, MatchesBruteForce) {
  TempDir dir;
  const Trace trace = writeRandomTrace(dir, "random.db", 3, 800, 31);
  const TraceReader reader = TraceReader::open(trace.path);
  const auto want = bruteLateness(reader);
  ASSERT_EQ(want.size(), 3u);
  expectLatenessEqual(reader.lateness(), want);
  // Rank 1 starts every collective 50 us late.
  EXPECT_GT(want[1].mean_ns, 40'000);
  EXPECT_LT(want[0].mean_ns, 20'000);
}

TEST(Lateness, UnmatchedCallsAndSingleRankTraces) {
  TempDir dir;
  // Rank 0's seq 0 and 1; rank 1's seq 1 only (on its own communicator with the same key).
  std::vector<CallRecord> calls = {span(0, 10), span(100, 110), span(130, 140, 1)};
  calls[1].seq = 1;
  calls[2].seq = 1;
  const std::string path = writeCalls(dir, "partial.db", calls);
  const auto lateness = TraceReader::open(path).lateness();
  ASSERT_EQ(lateness.size(), 2u);
  EXPECT_EQ(lateness[0].matched, 1);
  EXPECT_EQ(lateness[0].max_ns, 0);
  EXPECT_EQ(lateness[1].matched, 1);
  EXPECT_EQ(lateness[1].max_ns, 30);
  EXPECT_EQ(lateness[1].mean_ns, 30.0);

  std::vector<CallRecord> alone = {span(0, 10), span(20, 30)};
  alone[1].seq = 1;
  const std::string single = writeCalls(dir, "single.db", alone);
  EXPECT_TRUE(TraceReader::open(single).lateness().empty());
}

// BUG: storage/src/reader.cc lateness() compares raw start_ns across ranks without adding each rank's
// ranks.clock_offset_ns ("add to this rank's times to align them with rank 0", records.h), so a rank
// whose clock runs behind looks early or late by its clock offset. (writeChromeTrace applies offsets.)
TEST(Lateness, AppliesClockOffsets) {
  TempDir dir;
  // Rank 1's clock is 1 ms behind: its raw times are 1 ms early. Aligned, it starts 20 ns after rank 0.
  const std::string path = writeCalls(dir, "offset.db", {span(1'000'000, 1'000'100), span(20, 120, 1)},
                                      /*rank1_offset=*/1'000'000);
  const TraceReader reader = TraceReader::open(path);
  const auto want = bruteLateness(reader);
  ASSERT_EQ(want.size(), 2u);
  EXPECT_EQ(want[1].max_ns, 20);
  expectLatenessEqual(reader.lateness(), want);
}

}  // namespace
}  // namespace gradscope::storage
