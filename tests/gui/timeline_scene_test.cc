// The timeline's scene (models/timeline_scene.h), read as data: rows per rank under their hosts, a bar's
// columns from the time↔pixel math (clock offsets, clipping), at most one bar per pixel column and row
// (dense calls, fresh and stale aggregated frames), the axis, legend and status labels, the selection,
// what a point hits, a selected message's arrow, nonblocking calls' posted parts, and an API colour for
// every API. Then the window query the timeline and the calls table share
// (storage/window.h): both list the same calls for a window, a long call that started before it included.

#include "models/timeline_scene.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <span>
#include <stdexcept>
#include <vector>

#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>

#include "gradscope/common/units.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "models/calls_model.h"
#include "models/palette.h"
#include "models/peer_flows.h"

using namespace gradscope;
using namespace gradscope::gui;

namespace {

constexpr int kCharWidth = 7;
using Columns = QPair<int, int>;  // [left, right) in pixels

std::vector<storage::RankInfo> fourRanks() {
  std::vector<storage::RankInfo> ranks;
  for (int r = 0; r < 4; ++r) {
    storage::RankInfo rank;
    rank.id = r;
    rank.rank = r;
    rank.host = "node" + std::to_string(r / 2);
    ranks.push_back(rank);
  }
  return ranks;
}

TimelineSceneInput inputFor(const std::vector<storage::RankInfo>& ranks, const TimelineFrame* frame,
                            TimeRange window, QSize size = {1000, 400}) {
  TimelineSceneInput input;
  input.size = size;
  input.ranks = ranks;
  input.frame = frame;
  input.window = window;
  input.has_trace = true;
  input.text = {14, [](const QString& text) { return kCharWidth * static_cast<int>(text.size()); }};
  return input;
}

storage::CallRecord call(std::int64_t id, std::int64_t rank_id, std::int64_t start, std::int64_t end,
                         Api api = Api::MpiAllreduce) {
  storage::CallRecord c;
  c.id = id;
  c.rank_id = rank_id;
  c.start_ns = start;
  c.end_ns = end;
  c.api = api;
  c.bytes = 4096;
  return c;
}

TimelineFrame detailedFrame(TimeRange window, std::vector<storage::CallRecord> calls) {
  TimelineFrame frame;
  frame.window = window;
  frame.detailed = true;
  for (storage::CallRecord& c : calls) {
    ++frame.window_calls;
    frame.calls[c.rank_id].push_back(c);
  }
  for (auto& [rank, list] : frame.calls)
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  return frame;
}

std::vector<const SceneBar*> barsOfRank(const TimelineScene& scene, std::int64_t rank_id) {
  std::vector<const SceneBar*> bars;
  for (const SceneBar& bar : scene.bars)
    if (scene.rows[bar.row].rank_id == rank_id && !scene.rows[bar.row].host_header) bars.push_back(&bar);
  return bars;
}

// Bars of a row never share a column and lie inside the plot.
bool onePerColumn(const TimelineScene& scene, const std::vector<const SceneBar*>& bars) {
  int last_right = scene.plot.left();
  for (const SceneBar* bar : bars) {
    if (bar->rect.width() < 1 || bar->rect.left() < last_right) return false;
    last_right = bar->rect.left() + bar->rect.width();
    if (last_right > scene.plot.right() + 1) return false;
  }
  return true;
}

QPoint middleOf(const QRect& rect) {
  return {rect.left() + rect.width() / 2, rect.top() + rect.height() / 2};
}

// The message from `send` to `receive` as loadPeerFlows gives it.
PeerFlow flowOf(const storage::CallRecord& send, const storage::CallRecord& receive, int from_rank,
                int to_rank, int tag) {
  PeerFlow flow;
  flow.send_call_id = send.id;
  flow.recv_call_id = receive.id;
  flow.send_rank_id = send.rank_id;
  flow.recv_rank_id = receive.rank_id;
  flow.send_start_ns = send.start_ns;
  flow.send_end_ns = send.end_ns;
  flow.recv_start_ns = receive.start_ns;
  flow.recv_end_ns = receive.end_ns;
  flow.bytes = send.bytes;
  flow.tag = tag;
  flow.from_rank = from_rank;
  flow.to_rank = to_rank;
  return flow;
}

const SceneRow& rowOf(const TimelineScene& scene, std::int64_t rank_id) {
  for (const SceneRow& row : scene.rows)
    if (!row.host_header && row.rank_id == rank_id) return row;
  throw std::runtime_error("no row");
}

}  // namespace

class TimelineSceneTest : public QObject {
  Q_OBJECT
 private slots:
  void rowsPerRankUnderTheirHosts() {
    const std::vector<storage::RankInfo> ranks = fourRanks();
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, nullptr, {0, 1e6}));
    QCOMPARE(scene.plot, QRect(kTimelineLabelWidth, kTimelineAxisHeight, 1000 - kTimelineLabelWidth - 8,
                               400 - kTimelineAxisHeight - kTimelineLegendHeight));
    QCOMPARE(scene.rows.size(), std::size_t{6});
    QStringList labels;
    for (const SceneRow& row : scene.rows) labels << (row.label ? row.label->text : QString());
    QCOMPARE(labels, (QStringList{QStringLiteral("node0  ·  2 ranks"), QStringLiteral("rank 0"),
                                  QStringLiteral("rank 1"), QStringLiteral("node1  ·  2 ranks"),
                                  QStringLiteral("rank 2"), QStringLiteral("rank 3")}));
    // Rows follow one another from the axis down; rank rows at their largest height here, every other
    // one under a header shaded, bars in the middle three quarters.
    int y = kTimelineAxisHeight;
    for (const SceneRow& row : scene.rows) {
      QCOMPARE(row.top, y);
      QCOMPARE(row.height, row.host_header ? kTimelineHostHeight : kTimelineMaxRowHeight);
      y += row.height;
    }
    QCOMPARE(scene.rows[1].stripe, false);
    QCOMPARE(scene.rows[2].stripe, true);
    QCOMPARE(scene.rows[4].stripe, false);
    QCOMPARE(scene.rows[1].bar_top, scene.rows[1].top + kTimelineMaxRowHeight / 8);
    QCOMPARE(scene.rows[1].bar_height, kTimelineMaxRowHeight - 2 * (kTimelineMaxRowHeight / 8));
    QCOMPARE(scene.rows[5].rank_id, std::int64_t{3});
    QCOMPARE(scene.rankRowAt(scene.rows[5].top + 3), &scene.rows[5]);
    QCOMPARE(scene.rankRowAt(scene.rows[3].top + 3), nullptr);  // a host header

    // A rank filter shows that rank only, under its host.
    TimelineSceneInput filtered = inputFor(ranks, nullptr, {0, 1e6});
    filtered.filter.rank_id = 2;
    const TimelineScene one = buildTimelineScene(filtered);
    QCOMPARE(one.rows.size(), std::size_t{2});
    QCOMPARE(one.rows[0].label->text, QStringLiteral("node1  ·  1 rank"));
    QCOMPARE(one.rows[1].rank_id, std::int64_t{2});

    // Many ranks: rows shrink to the minimum height, too low for a label.
    std::vector<storage::RankInfo> many;
    for (int r = 0; r < 200; ++r) many.push_back({r, 0, r, "node0", 0, "cpu", 0});
    const TimelineScene crowded = buildTimelineScene(inputFor(many, nullptr, {0, 1e6}));
    QCOMPARE(crowded.rows.size(), std::size_t{201});
    QCOMPARE(crowded.rows[1].height, kTimelineMinRowHeight);
    QVERIFY(!crowded.rows[1].label.has_value());
    QCOMPARE(preferredTimelineHeight(ranks), kTimelineAxisHeight + 2 * kTimelineHostHeight +
                                                 4 * kTimelineMaxRowHeight + kTimelineLegendHeight + 8);
  }

  void aBarSpansItsCallsColumns() {
    const std::vector<storage::RankInfo> ranks = [] {
      std::vector<storage::RankInfo> r = fourRanks();
      r[1].clock_offset_ns = 50'000;  // rank 1's clock runs 50 µs behind rank 0's
      return r;
    }();
    const TimeRange window{1'000'000, 2'000'000};
    const TimelineFrame frame =
        detailedFrame(window, {call(1, 0, 1'250'000, 1'260'000), call(2, 1, 1'250'000, 1'260'000),
                               call(3, 2, 900'000, 1'100'000), call(4, 3, 1'950'000, 2'300'000)});
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, &frame, window));
    QVERIFY(scene.detailed);
    const TimelineMath& m = scene.math;
    QCOMPARE(m.x0, static_cast<double>(scene.plot.left()));
    QCOMPARE(m.width, static_cast<double>(scene.plot.width()));
    const auto columns = [&](double start, double end) {
      const int left = static_cast<int>(std::floor(m.timeToX(start)));
      return Columns(left, std::max(left + 1, static_cast<int>(std::ceil(m.timeToX(end)))));
    };
    const auto span = [](const SceneBar* bar) {
      return Columns(bar->rect.left(), bar->rect.left() + bar->rect.width());
    };
    const auto rank0 = barsOfRank(scene, 0);
    QCOMPARE(rank0.size(), std::size_t{1});
    QCOMPARE(span(rank0[0]), columns(1'250'000, 1'260'000));
    QCOMPARE(rank0[0]->colour, apiColor(Api::MpiAllreduce).rgb());
    const SceneRow& row0 = scene.rows[rank0[0]->row];
    QCOMPARE(rank0[0]->rect.top(), row0.bar_top);
    QCOMPARE(rank0[0]->rect.height(), row0.bar_height);
    // Rank 1 is drawn on rank 0's clock: its offset added.
    QCOMPARE(span(barsOfRank(scene, 1)[0]), columns(1'300'000, 1'310'000));
    // Calls that run past the window's edges are clipped to the plot.
    QCOMPARE(span(barsOfRank(scene, 2)[0]), Columns(scene.plot.left(), columns(1'000'000, 1'100'000).second));
    QCOMPARE(span(barsOfRank(scene, 3)[0]),
             Columns(columns(1'950'000, 2'000'000).first, scene.plot.right() + 1));
    // An outline around the selected call, two pixels out.
    TimelineSceneInput selected = inputFor(ranks, &frame, window);
    selected.selection = SelectedCall{1, 0, 1'250'000, 1'260'000};
    const TimelineScene outlined = buildTimelineScene(selected);
    QVERIFY(outlined.selection.has_value());
    QCOMPARE(outlined.selection->left(), columns(1'250'000, 1'260'000).first - 2);
    QCOMPARE(outlined.selection->top(), row0.top + 1);
  }

  void denseCallsGiveOneBarPerColumn() {
    const std::vector<storage::RankInfo> ranks = fourRanks();
    const TimeRange window{0, 1'000'000};
    // 20,000 calls of two alternating APIs on rank 0, ~23 per pixel column, each 30 ns long.
    std::vector<storage::CallRecord> calls;
    for (int i = 0; i < 20'000; ++i)
      calls.push_back(call(i + 1, 0, i * 50, i * 50 + 30, i % 2 == 0 ? Api::MpiAllreduce : Api::MpiBcast));
    const TimelineFrame frame = detailedFrame(window, calls);
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, &frame, window));
    const auto bars = barsOfRank(scene, 0);
    QVERIFY(!bars.empty());
    QVERIFY(onePerColumn(scene, bars));
    // No bar drifts from its calls: each ends at most one column after the calls it stands for.
    for (const SceneBar* bar : bars) {
      const auto& list = frame.calls.at(0);
      double last_end = 0;
      for (std::size_t i = bar->first; i <= bar->last; ++i)
        last_end = std::max(last_end, static_cast<double>(list[i].end_ns));
      QVERIFY(bar->rect.left() + bar->rect.width() <=
              static_cast<int>(std::ceil(scene.math.timeToX(last_end))) + 1);
    }
    // Every call is some bar's.
    std::size_t covered = 0;
    for (const SceneBar* bar : bars) covered += bar->last - bar->first + 1;
    QCOMPARE(covered, calls.size());
    // Both APIs in the legend, in API order.
    QCOMPARE(scene.legend.size(), std::size_t{2});
    QCOMPARE(scene.legend[0].api, Api::MpiAllreduce);
    QCOMPARE(scene.legend[1].api, Api::MpiBcast);

    // A short call of another API right after a long one, in the long one's last column: it takes the
    // next column; one inside the long call stays under it.
    const TimelineFrame pair =
        detailedFrame(window, {call(1, 0, 100'000, 200'000), call(2, 0, 150'000, 150'010, Api::MpiBcast),
                               call(3, 0, 200'000, 200'010, Api::MpiBcast)});
    const TimelineScene after = buildTimelineScene(inputFor(ranks, &pair, window));
    const auto two = barsOfRank(after, 0);
    QCOMPARE(two.size(), std::size_t{2});
    QCOMPARE(two[0]->last, std::size_t{1});
    QCOMPARE(two[1]->colour, apiColor(Api::MpiBcast).rgb());
    QCOMPARE(two[1]->rect.left(), two[0]->rect.left() + two[0]->rect.width());
    QCOMPARE(two[1]->rect.width(), 1);
  }

  void aggregatedFramesGiveOneBarPerColumn() {
    const std::vector<storage::RankInfo> ranks = fourRanks();
    const QSize size{1000, 400};
    const int columns = timelinePlotRect(size).width();
    const TimeRange window{0, static_cast<double>(columns) * 1000};
    TimelineFrame frame;
    frame.window = window;
    frame.columns = columns;
    frame.summary.t0_ns = 0;
    frame.summary.t1_ns = static_cast<std::int64_t>(window.end_ns);
    frame.summary.columns = columns;
    frame.summary.rank_ids = {0, 1, 2, 3};
    frame.summary.buckets.assign(4, std::vector<storage::TimelineBucket>(static_cast<std::size_t>(columns)));
    for (auto& rank : frame.summary.buckets)
      for (std::size_t i = 0; i < rank.size(); ++i) {
        rank[i].calls = 3;
        rank[i].busy_ns = static_cast<std::int64_t>(i % 4) * 250;  // 0, 25, 50, 75 % busy
        rank[i].dominant_api = i % 2 == 0 ? Api::MpiAllreduce : Api::MpiAllgather;
      }
    frame.window_calls = 3 * 4 * columns;
    // The frame's own window: a bar per bucket, each one column, its height the share spent busy.
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, &frame, window, size));
    QVERIFY(!scene.detailed);
    for (std::int64_t rank = 0; rank < 4; ++rank) {
      const auto bars = barsOfRank(scene, rank);
      QCOMPARE(static_cast<int>(bars.size()), columns);
      QVERIFY(onePerColumn(scene, bars));
    }
    const auto bars = barsOfRank(scene, 0);
    const SceneRow& row = scene.rows[bars[0]->row];
    QCOMPARE(bars[2]->rect.height(), static_cast<int>(std::lround(0.5 * row.bar_height)));
    QCOMPARE(bars[2]->rect.bottom(), row.bar_top + row.bar_height - 1);  // bars stand on the band's floor
    QCOMPARE(bars[0]->rect.height(), 3);                                 // idle but with calls: visible
    QCOMPARE(bars[1]->colour, apiColor(Api::MpiAllgather).rgb());
    QCOMPARE(scene.status.text,
             QStringLiteral("%1 calls in view, aggregated per pixel column  ·  window %2")
                 .arg(QString::fromStdString(formatCount(static_cast<std::uint64_t>(3 * 4 * columns))),
                      QString::fromStdString(formatDuration(window.length()))));

    // Zoomed out 2.5× while the next frame loads: the old buckets are narrower than a column; still at
    // most one bar per column, none past the old window's end.
    const TimeRange wider{-0.75 * window.end_ns, 1.75 * window.end_ns};
    const TimelineScene stale = buildTimelineScene(inputFor(ranks, &frame, wider, size));
    const auto stale_bars = barsOfRank(stale, 0);
    QVERIFY(onePerColumn(stale, stale_bars));
    QVERIFY(static_cast<int>(stale_bars.size()) <= columns / 2 + 2);
    QVERIFY(stale_bars.front()->rect.left() >= static_cast<int>(std::floor(stale.math.timeToX(0))));
    QVERIFY(stale_bars.back()->rect.left() + stale_bars.back()->rect.width() <=
            static_cast<int>(std::ceil(stale.math.timeToX(window.end_ns))));
    // A filter on the API greys out the other API's columns.
    TimelineSceneInput filtered = inputFor(ranks, &frame, window, size);
    filtered.filter.api = Api::MpiAllreduce;
    const TimelineScene dimmed = buildTimelineScene(filtered);
    QCOMPARE(barsOfRank(dimmed, 0)[1]->colour, dimmedColor().rgb());
    QCOMPARE(barsOfRank(dimmed, 0)[0]->colour, apiColor(Api::MpiAllreduce).rgb());
  }

  void axisLegendAndStatusLabels() {
    const std::vector<storage::RankInfo> ranks = fourRanks();
    const TimeRange window{0, 10'000'000};  // 10 ms
    const TimelineFrame frame = detailedFrame(
        window, {call(1, 0, 1'000'000, 2'000'000), call(2, 1, 3'000'000, 4'000'000, Api::MpiBcast)});
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, &frame, window));
    // Ticks: the multiples of a 1-2-5 step inside the window, where the math puts them, labelled in one unit.
    const AxisTicks expected = axisTicks(window, std::max(2, scene.plot.width() / 110));
    QCOMPARE(scene.ticks.size(), std::size_t{5});  // 0, 2, 4, 6, 8 ms; 10 ms is past the plot's last column
    for (const AxisTick& tick : scene.ticks) {
      QCOMPARE(tick.x, static_cast<int>(std::lround(scene.math.timeToX(tick.t_ns))));
      QCOMPARE(tick.label.text, QString::fromStdString(tickLabel(tick.t_ns, expected.step_ns)));
      QVERIFY(tick.label.rect.left() >= scene.plot.left());
    }
    QCOMPARE(scene.ticks[1].label.text, QStringLiteral("0.002 s"));
    QCOMPARE(scene.axis_title.text, QStringLiteral("time"));
    // Legend: a swatch and the name of each API in view, side by side; the status right of them.
    QCOMPARE(scene.legend.size(), std::size_t{2});
    QCOMPARE(scene.legend[0].label.text, QStringLiteral("MPI_Allreduce"));
    QCOMPARE(scene.legend[1].label.text, QStringLiteral("MPI_Bcast"));
    QCOMPARE(scene.legend[1].swatch.left(), 8 + 16 + kCharWidth * 13 + 16);
    QVERIFY(scene.status.right);
    QCOMPARE(scene.status.rect.left(), scene.legend[1].swatch.left() + 16 + kCharWidth * 9 + 16);
    QCOMPARE(scene.status.text, QStringLiteral("2 calls in view  ·  window %1")
                                    .arg(QString::fromStdString(formatDuration(window.length()))));
    QVERIFY(!scene.status_is_error);
    // The states before a frame, and an error.
    TimelineSceneInput input = inputFor(ranks, nullptr, window);
    QCOMPARE(buildTimelineScene(input).status.text, QStringLiteral("loading…"));
    input.has_trace = false;
    QCOMPARE(buildTimelineScene(input).status.text, QStringLiteral("no trace"));
    input.error = QStringLiteral("trace.db: truncated trace");
    const TimelineScene failed = buildTimelineScene(input);
    QCOMPARE(failed.status.text, input.error);
    QVERIFY(failed.status_is_error);
    QVERIFY(failed.bars.empty());
  }

  void aPointHitsWhatIsDrawnThere() {
    const std::vector<storage::RankInfo> ranks = fourRanks();
    const TimeRange window{0, 1'000'000};
    // Rank 0: a wide call, a thin one (under a pixel), and two of one API sharing pixels.
    const TimelineFrame frame =
        detailedFrame(window, {call(1, 0, 100'000, 200'000), call(2, 0, 500'000, 500'010, Api::MpiBcast),
                               call(3, 0, 800'000, 800'300), call(4, 0, 800'400, 800'700)});
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, &frame, window));
    const auto bars = barsOfRank(scene, 0);
    QCOMPARE(bars.size(), std::size_t{3});
    const SceneRow& row = scene.rows[bars[0]->row];
    const int y = row.top + row.height / 2;
    const auto idAt = [&](int x) -> std::int64_t {
      const storage::CallRecord* hit = callAt(scene, frame, {x, y});
      return hit ? hit->id : 0;
    };
    QCOMPARE(idAt(middleOf(bars[0]->rect).x()), std::int64_t{1});
    // Anywhere in the row's height, not only on the bar.
    QCOMPARE(callAt(scene, frame, {middleOf(bars[0]->rect).x(), row.top})->id, std::int64_t{1});
    // The thin call is one column wide: hit within two columns of it, not three.
    QCOMPARE(bars[1]->rect.width(), 1);
    const int thin = bars[1]->rect.left();
    QCOMPARE(idAt(thin), std::int64_t{2});
    QCOMPARE(idAt(thin + kTimelineHitSlack), std::int64_t{2});
    QCOMPARE(idAt(thin - kTimelineHitSlack), std::int64_t{2});
    QCOMPARE(idAt(thin + kTimelineHitSlack + 1), std::int64_t{0});
    // Two calls in one bar: the one nearest in time.
    QCOMPARE(bars[2]->first, std::size_t{2});
    QCOMPARE(bars[2]->last, std::size_t{3});
    QCOMPARE(idAt(static_cast<int>(scene.math.timeToX(800'050))), std::int64_t{3});
    QCOMPARE(idAt(static_cast<int>(std::floor(scene.math.timeToX(800'700)))), std::int64_t{4});
    // Nothing between bars, over a header, in the gutter or on a rank without calls.
    QCOMPARE(idAt(static_cast<int>(scene.math.timeToX(350'000))), std::int64_t{0});
    QCOMPARE(callAt(scene, frame, {middleOf(bars[0]->rect).x(), scene.rows[0].top + 2}), nullptr);
    QCOMPARE(callAt(scene, frame, {20, y}), nullptr);
    QCOMPARE(callAt(scene, frame, {middleOf(bars[0]->rect).x(), scene.rows[2].top + 2}), nullptr);
    // Every point of every bar hits a call of that bar.
    for (const SceneBar& bar : scene.bars) {
      for (int x = bar.rect.left(); x <= bar.rect.right(); ++x) {
        const storage::CallRecord* hit = callAt(scene, frame, {x, bar.rect.top()});
        QVERIFY(hit != nullptr);
        const auto& list = frame.calls.at(scene.rows[bar.row].rank_id);
        const auto index = static_cast<std::size_t>(hit - list.data());
        QVERIFY(index >= bar.first && index <= bar.last);
      }
    }
    QCOMPARE(bucketAt(scene, frame, {middleOf(bars[0]->rect).x(), y}), nullptr);  // not an aggregated frame
  }

  // Selecting either end of a message draws one arrow from the send's end (sender's row) to the
  // receive's end (receiver's row, its clock offset applied); an MPI_Sendrecv has two.
  void aSelectedMessageHasItsArrow() {
    std::vector<storage::RankInfo> ranks = fourRanks();
    ranks[1].clock_offset_ns = 10'000;
    const TimeRange window{0, 1'000'000};
    storage::CallRecord send = call(1, 0, 200'000, 300'000, Api::MpiSend);
    send.dest = 1;
    send.send_tag = 7;
    storage::CallRecord receive = call(2, 1, 150'000, 320'000, Api::MpiRecv);
    receive.source = 0;
    receive.recv_tag = 7;
    const storage::CallRecord reduce = call(3, 2, 400'000, 500'000);
    storage::CallRecord exchange2 = call(4, 2, 600'000, 700'000, Api::MpiSendrecv);
    storage::CallRecord exchange3 = call(5, 3, 600'000, 650'000, Api::MpiSendrecv);
    exchange2.dest = exchange2.source = 1;
    exchange3.dest = exchange3.source = 0;  // ranks in a two-rank communicator
    const TimelineFrame frame = detailedFrame(window, {send, receive, reduce, exchange2, exchange3});
    const PeerFlows flows({flowOf(exchange3, exchange2, 3, 2, 0), flowOf(send, receive, 0, 1, 7),
                           flowOf(exchange2, exchange3, 2, 3, 0)});

    TimelineSceneInput input = inputFor(ranks, &frame, window);
    input.flows = &flows;
    input.selection = SelectedCall{1, 0, 200'000, 300'000};
    const TimelineScene scene = buildTimelineScene(input);
    QCOMPARE(scene.arrows.size(), std::size_t{1});
    const SceneArrow& arrow = scene.arrows[0];
    const SceneRow& sender = rowOf(scene, 0);
    const SceneRow& receiver = rowOf(scene, 1);
    QCOMPARE(arrow.send_end, QPointF(scene.math.timeToX(300'000), sender.bar_top + sender.bar_height / 2.0));
    QCOMPARE(arrow.recv_end,
             QPointF(scene.math.timeToX(330'000), receiver.bar_top + receiver.bar_height / 2.0));
    QCOMPARE(arrow.from, arrow.send_end.toPoint());
    QCOMPARE(arrow.to, arrow.recv_end.toPoint());
    QVERIFY(arrow.head);
    QVERIFY(arrow.tail);
    QCOMPARE(arrow.send_call_id, std::int64_t{1});
    QCOMPARE(arrow.recv_call_id, std::int64_t{2});
    QCOMPARE(arrow.label.text, QStringLiteral("4 KiB · tag 7"));
    QVERIFY(scene.plot.contains(arrow.label.rect));

    // The receive selected: the same arrow.
    input.selection = SelectedCall{2, 1, 150'000, 320'000};
    const TimelineScene from_receive = buildTimelineScene(input);
    QCOMPARE(from_receive.arrows.size(), std::size_t{1});
    QCOMPARE(from_receive.arrows[0].send_end, arrow.send_end);
    QCOMPARE(from_receive.arrows[0].recv_end, arrow.recv_end);
    // A Sendrecv: the message it sent and the one it received.
    input.selection = SelectedCall{4, 2, 600'000, 700'000};
    const TimelineScene both = buildTimelineScene(input);
    QCOMPARE(both.arrows.size(), std::size_t{2});
    QCOMPARE(both.arrows[0].send_call_id, std::int64_t{4});
    QCOMPARE(both.arrows[1].send_call_id, std::int64_t{5});
    QCOMPARE(both.arrows[0].label.text, QStringLiteral("4 KiB · tag 0"));
    // No arrow for a collective, without the trace's messages, or when the filter hides the partner's row.
    input.selection = SelectedCall{3, 2, 400'000, 500'000};
    QVERIFY(buildTimelineScene(input).arrows.empty());
    input.selection = SelectedCall{1, 0, 200'000, 300'000};
    input.flows = nullptr;
    QVERIFY(buildTimelineScene(input).arrows.empty());
    input.flows = &flows;
    input.filter.rank_id = 0;
    QVERIFY(buildTimelineScene(input).arrows.empty());
    input.filter = {};

    // The receive's end right of the window: the arrow runs to the plot's edge, without a head.
    TimelineSceneInput cut = inputFor(ranks, &frame, {0, 310'000});
    cut.flows = &flows;
    cut.selection = SelectedCall{1, 0, 200'000, 300'000};
    const TimelineScene clipped = buildTimelineScene(cut);
    QCOMPARE(clipped.arrows.size(), std::size_t{1});
    QVERIFY(!clipped.arrows[0].head);
    QVERIFY(clipped.arrows[0].tail);
    QCOMPARE(clipped.arrows[0].to.x(), clipped.plot.left() + clipped.plot.width());
    QVERIFY(clipped.arrows[0].recv_end.x() > clipped.plot.left() + clipped.plot.width());
    // Both ends far outside on one side: nothing to draw.
    TimelineSceneInput gone = inputFor(ranks, &frame, {800'000, 900'000});
    gone.flows = &flows;
    gone.selection = SelectedCall{1, 0, 200'000, 300'000};
    QVERIFY(buildTimelineScene(gone).arrows.empty());
  }

  // A nonblocking call: a thin bar from posting to the wait, the full bar for the wait; a blocking call's
  // enqueue time draws nothing; thin parts of one colour merge; the legend explains them.
  void nonblockingCallsShowWhenTheyWerePosted() {
    const std::vector<storage::RankInfo> ranks = fourRanks();
    const TimeRange window{0, 1'000'000};
    storage::CallRecord first = call(1, 0, 500'000, 600'000, Api::MpiIrecv);
    first.enqueue_ns = 100'000;
    storage::CallRecord second = call(2, 0, 600'000, 650'000, Api::MpiIrecv);
    second.enqueue_ns = 150'000;  // posted while the first is
    storage::CallRecord blocking = call(3, 1, 300'000, 400'000, Api::MpiRecv);
    blocking.enqueue_ns = 100'000;
    storage::CallRecord isend = call(4, 2, 800'000, 900'000, Api::MpiIsend);
    isend.enqueue_ns = 700'000;
    const TimelineFrame frame = detailedFrame(window, {first, second, blocking, isend});
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, &frame, window));
    const auto columns = [&](double start, double end) {
      const int left = static_cast<int>(std::floor(scene.math.timeToX(start)));
      return Columns(left, std::max(left + 1, static_cast<int>(std::ceil(scene.math.timeToX(end)))));
    };
    QCOMPARE(scene.posted.size(), std::size_t{2});
    const SceneBar& posted = scene.posted[0];
    const SceneRow& row = scene.rows[posted.row];
    QCOMPARE(row.rank_id, std::int64_t{0});
    QCOMPARE(Columns(posted.rect.left(), posted.rect.left() + posted.rect.width()),
             columns(100'000, 600'000));
    QCOMPARE(posted.rect.height(), std::max(2, row.bar_height / 5));
    QVERIFY(posted.rect.top() > row.bar_top);
    QVERIFY(posted.rect.bottom() < row.bar_top + row.bar_height - 1);
    QCOMPARE(posted.colour, apiColor(Api::MpiIrecv).rgb());
    QCOMPARE(scene.rows[scene.posted[1].row].rank_id, std::int64_t{2});
    QCOMPARE(scene.posted[1].colour, apiColor(Api::MpiIsend).rgb());
    // The full bars stay the waits.
    const auto waits = barsOfRank(scene, 0);
    QCOMPARE(waits.front()->rect.left(), columns(500'000, 600'000).first);
    // The thin part hits nothing.
    QCOMPARE(callAt(scene, frame, {columns(300'000, 300'001).first, row.bar_top + row.bar_height / 2}),
             nullptr);
    // The legend: the APIs, then the key of the thin bars.
    QCOMPARE(scene.legend.size(), std::size_t{4});
    QVERIFY(scene.legend.back().posted);
    QCOMPARE(scene.legend.back().label.text, QStringLiteral("thin: posted, not yet waited for"));
    QVERIFY(!scene.legend.front().posted);

    // Only the posted part in view: drawn, and its API in the legend.
    const TimelineScene early = buildTimelineScene(inputFor(ranks, &frame, {0, 400'000}));
    QVERIFY(barsOfRank(early, 0).empty());
    QCOMPARE(early.posted.size(), std::size_t{1});
    QCOMPARE(early.legend.front().api, Api::MpiRecv);
    QCOMPARE(early.legend[1].api, Api::MpiIrecv);
  }

  // Too many APIs for the width: the legend stops short of the status line and counts the rest.
  void theLegendLeavesRoomForTheStatus() {
    const std::vector<storage::RankInfo> ranks = fourRanks();
    const TimeRange window{0, 1'000'000};
    std::vector<storage::CallRecord> calls;
    const std::span<const Api> apis = allApis();
    for (std::size_t i = 0; i < 12; ++i) {
      const auto start = static_cast<std::int64_t>(i) * 50'000;
      calls.push_back(call(static_cast<std::int64_t>(i + 1), 0, start, start + 20'000, apis[i]));
      calls.back().enqueue_ns = start;  // no posted part: twelve APIs, no key
    }
    const TimelineFrame frame = detailedFrame(window, calls);
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, &frame, window, {900, 400}));
    QVERIFY(scene.legend_more.has_value());
    QVERIFY(!scene.legend.empty());
    QCOMPARE(scene.legend.size() + static_cast<std::size_t>(scene.legend_hidden.size()), std::size_t{12});
    QCOMPARE(scene.legend_more->text, QStringLiteral("+%1 more").arg(scene.legend_hidden.size()));
    const LegendEntry& last = scene.legend.back();
    QVERIFY(last.label.rect.left() + last.label.rect.width() <= scene.legend_more->rect.left());
    QVERIFY(scene.legend_more->rect.left() + scene.legend_more->rect.width() <=
            scene.status.rect.left() + scene.status.rect.width() -
                kCharWidth * static_cast<int>(scene.status.text.size()));
    for (const QString& hidden : scene.legend_hidden) QVERIFY(hidden.startsWith(QStringLiteral("MPI_")));
  }

  // Every API has a colour, and it says what the call does: one per kind of operation, nonblocking forms
  // lighter; point-to-point is one family, sends darkest, receives lightest.
  void everyApiHasTheColourOfWhatItDoes() {
    std::map<std::pair<Collective, bool>, QRgb> by_kind;
    std::set<QRgb> colours;
    for (const Api api : allApis()) {
      const QColor colour = apiColor(api);
      QVERIFY2(colour != apiColor(Api::Unknown), name(api).data());
      const std::pair kind{collectiveOf(api), isNonblocking(api)};
      const auto [found, added] = by_kind.emplace(kind, colour.rgb());
      QVERIFY2(found->second == colour.rgb(), name(api).data());                   // same kind, same colour
      if (added) QVERIFY2(colours.insert(colour.rgb()).second, name(api).data());  // another kind, another
      if (isNonblocking(api)) {
        // Nonblocking forms are their blocking form's colour, lighter.
        const auto blocking = by_kind.find({collectiveOf(api), false});
        if (blocking != by_kind.end()) {
          QVERIFY2(colour.lightness() > QColor::fromRgb(blocking->second).lightness(), name(api).data());
          QVERIFY2(std::abs(colour.hslHue() - QColor::fromRgb(blocking->second).hslHue()) <= 2,
                   name(api).data());
        }
      }
    }
    QCOMPARE(apiColor(Api::NcclSend), apiColor(Api::MpiSend));
    QCOMPARE(apiColor(Api::MpiSsend), apiColor(Api::MpiSend));
    QCOMPARE(apiColor(Api::NcclAlltoAll), apiColor(Api::MpiAlltoallv));
    const QColor send = apiColor(Api::MpiSend), both = apiColor(Api::MpiSendrecv),
                 receive = apiColor(Api::MpiRecv);
    QVERIFY(send.lightness() < both.lightness() && both.lightness() < receive.lightness());
    for (const QColor& other : {both, receive}) QVERIFY(std::abs(other.hslHue() - send.hslHue()) <= 10);
  }

  // The calls table and the timeline ask the store the same question for a window (storage/window.h) and
  // get the same calls: among them a long call that started 30 ms (seven finest tiles) before the window.
  void theCallsTableAndTheTimelineShowTheSameCalls() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const std::string path = dir.filePath(QStringLiteral("window.db")).toStdString();
    std::vector<storage::CallRecord> calls;
    {
      storage::TraceWriter writer = storage::TraceWriter::create(path);
      storage::RunInfo run;
      run.uuid = "00000000-0000-4000-8000-0000000000cc";
      run.mode = "observe";
      run.world_size = 2;
      run.host = "node0";
      const std::int64_t run_id = writer.addRun(run);
      for (int r = 0; r < 2; ++r) {
        const std::int64_t rank_id = writer.addRank({0, run_id, r, "node0", 100 + r, "cpu", 0});
        const std::int64_t comm_id = writer.addComm({0, rank_id, "world", Backend::Mpi, 2, r});
        std::vector<storage::CallRecord> rank_calls;
        for (int i = 0; i < 200; ++i) {  // a 20 µs call every 500 µs for 100 ms
          storage::CallRecord c = call(0, rank_id, i * 500'000, i * 500'000 + 20'000);
          c.comm_id = comm_id;
          c.seq = i;
          rank_calls.push_back(c);
        }
        storage::CallRecord slow = call(0, rank_id, 10'000'000 + r, 60'000'000, Api::MpiAllgather);
        slow.comm_id = comm_id;
        slow.seq = 1000;
        rank_calls.insert(rank_calls.begin() + 21, slow);
        const std::int64_t first = writer.appendCalls(rank_calls);
        for (std::size_t i = 0; i < rank_calls.size(); ++i)
          rank_calls[i].id = first + static_cast<std::int64_t>(i);
        calls.insert(calls.end(), rank_calls.begin(), rank_calls.end());
      }
      writer.finish(100'000'000);
    }
    const TimeRange window{40'100'000.4, 45'000'000.6};  // 4.9 ms, 30 ms after the long calls began
    const NanosecondWindow ns = wholeNanoseconds(window);
    std::set<std::int64_t> expected;
    for (const storage::CallRecord& c : calls)
      if (storage::inWindow(c.start_ns, c.end_ns, ns.t0_ns, ns.t1_ns)) expected.insert(c.id);
    QCOMPARE(expected.size(), std::size_t{2 * (10 + 1)});  // per rank ten short calls and the long one

    const storage::TraceReader reader = storage::TraceReader::open(path);
    const TimelineFrame frame = loadTimelineFrame(reader, window, 800, false);
    QVERIFY(frame.detailed);
    std::set<std::int64_t> timeline;
    for (const auto& [rank, list] : frame.calls)
      for (const storage::CallRecord& c : list) timeline.insert(c.id);
    QCOMPARE(timeline, expected);

    CallsModel model;
    model.setTrace(path, reader.ranks());
    CallsQuery query;
    query.window = window;
    model.setQuery(query);
    QSignalSpy pages(&model, &CallsModel::pageLoaded);
    QTRY_VERIFY_WITH_TIMEOUT(!model.loading(), 30000);
    while (model.canFetchMore({})) {
      model.fetchMore({});
      QTRY_VERIFY_WITH_TIMEOUT(!model.loading(), 30000);
    }
    std::set<std::int64_t> table;
    for (int row = 0; row < model.rowCount(); ++row) table.insert(model.rowAt(row)->call.id);
    QCOMPARE(table, expected);
    QTRY_VERIFY(model.matchingCalls().has_value());
    QCOMPARE(*model.matchingCalls(), static_cast<std::int64_t>(expected.size()));

    // And the timeline draws the long call from the plot's left edge: a point there hits it.
    const std::vector<storage::RankInfo> ranks = reader.ranks();
    const TimelineScene scene = buildTimelineScene(inputFor(ranks, &frame, window));
    for (const SceneRow& row : scene.rows) {
      if (row.host_header) continue;
      const storage::CallRecord* hit = callAt(scene, frame, {scene.plot.left(), row.bar_top});
      QVERIFY(hit != nullptr);
      QCOMPARE(hit->api, Api::MpiAllgather);
      QCOMPARE(hit->rank_id, row.rank_id);
    }
  }
};

QTEST_MAIN(TimelineSceneTest)
#include "timeline_scene_test.moc"
