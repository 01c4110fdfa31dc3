// The viewer's item models (QAbstractItemModelTester on each), the paged calls query against a plain
// sort of every call, the measurement aggregation, the Pareto front, the timeline frame loader, and the
// point-to-point views' data: the messages the timeline draws and the communication matrix, cell by cell,
// on a hand-built four-rank trace.

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include <QAbstractItemModelTester>
#include <QBrush>
#include <QFile>
#include <QFont>
#include <QSignalSpy>
#include <QSortFilterProxyModel>
#include <QTemporaryDir>
#include <QTest>

#include "gradscope/common/units.h"
#include "gradscope/storage/peers.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"
#include "gradscope/tuner/async.h"
#include "gradscope/tuner/check.h"
#include "gradscope/tuner/recommend.h"
#include "gui_test_support.h"
#include "models/analysis_models.h"
#include "models/calls_model.h"
#include "models/comm_matrix.h"
#include "models/jobs.h"
#include "models/peer_flows.h"
#include "models/sql.h"
#include "models/trace_data.h"

using namespace gradscope;
using namespace gradscope::gui;

namespace {
// Fetches every page of the model.
void fetchAll(CallsModel& model) {
  QSignalSpy pages(&model, &CallsModel::pageLoaded);
  QTRY_VERIFY_WITH_TIMEOUT(!model.loading(), 30000);
  while (model.canFetchMore({})) {
    model.fetchMore({});
    QTRY_VERIFY_WITH_TIMEOUT(!model.loading(), 30000);
  }
}

// Four ranks that talk point to point (world ranks = communicator ranks), written with TraceWriter:
//   0 → 1  two MPI_Send of 4 KiB (10 us each), taken by two MPI_Recv on 1 (30 us each)
//   1 → 2  an MPI_Isend of 1 MiB (50 us waiting), taken by an MPI_Irecv on 2 (100 us waiting)
//   2 ↔ 3  MPI_Sendrecv of 64 KiB each way (20 us on 2, 25 us on 3)
//   3 → 0  an MPI_Send of 512 B (5 us), taken by an MPI_Recv on 0 (7 us)
// and an MPI_Allreduce on every rank, which no point-to-point view counts.
struct PeerTrace {
  std::string path;
  std::vector<std::vector<std::int64_t>> ids;  // per rank, its calls' ids in the order above
};
PeerTrace writePeerTrace(const std::string& path) {
  storage::TraceWriter writer = storage::TraceWriter::create(path);
  storage::RunInfo run;
  run.uuid = "00000000-0000-4000-8000-0000000000dd";
  run.mode = "observe";
  run.backend = Backend::Mpi;
  run.world_size = 4;
  run.host = "node0";
  const std::int64_t run_id = writer.addRun(run);
  const auto message = [](Api api, std::int64_t bytes, std::int64_t start, std::int64_t end) {
    storage::CallRecord call;
    call.api = api;
    call.dtype = DType::Uint8;
    call.bytes = bytes;
    call.count = bytes;
    call.enqueue_ns = start;
    call.start_ns = start;
    call.end_ns = end;
    return call;
  };
  const auto send = [&](int dest, std::int64_t bytes, std::int64_t start, std::int64_t end,
                        Api api = Api::MpiSend) {
    storage::CallRecord call = message(api, bytes, start, end);
    call.dest = dest;
    call.send_tag = 0;
    return call;
  };
  const auto receive = [&](int source, std::int64_t bytes, std::int64_t start, std::int64_t end,
                           Api api = Api::MpiRecv) {
    storage::CallRecord call = message(api, bytes, start, end);
    call.source = source;
    call.recv_tag = 0;
    call.recv_bytes = bytes;
    return call;
  };
  const auto exchange = [&](int peer, std::int64_t start, std::int64_t end) {
    storage::CallRecord call = message(Api::MpiSendrecv, 64 << 10, start, end);
    call.dest = call.source = peer;
    call.send_tag = call.recv_tag = 0;
    call.recv_bytes = 64 << 10;
    return call;
  };
  std::vector<std::vector<storage::CallRecord>> calls(4);
  calls[0] = {send(1, 4096, 1'000, 11'000), send(1, 4096, 100'000, 110'000),
              receive(3, 512, 495'000, 502'000)};
  calls[1] = {receive(0, 4096, 0, 30'000), receive(0, 4096, 90'000, 120'000),
              send(2, 1 << 20, 250'000, 300'000, Api::MpiIsend)};
  calls[1][2].enqueue_ns = 200'000;
  calls[2] = {receive(1, 1 << 20, 200'000, 300'000, Api::MpiIrecv), exchange(3, 400'000, 420'000)};
  calls[2][0].enqueue_ns = 150'000;
  calls[3] = {exchange(2, 400'000, 425'000), send(0, 512, 500'000, 505'000)};
  PeerTrace trace{path, {}};
  for (int rank = 0; rank < 4; ++rank) {
    const std::int64_t rank_id = writer.addRank({0, run_id, rank, "node0", 100 + rank, "cpu", 0});
    const std::int64_t comm_id = writer.addComm({0, rank_id, "world", Backend::Mpi, 4, rank});
    storage::CallRecord reduce = message(Api::MpiAllreduce, 4096, 600'000, 650'000);
    reduce.op = ReduceOp::Sum;
    calls[static_cast<std::size_t>(rank)].push_back(reduce);
    std::int64_t seq = 0;
    for (storage::CallRecord& call : calls[static_cast<std::size_t>(rank)]) {
      call.rank_id = rank_id;
      call.comm_id = comm_id;
      call.seq = seq++;
    }
    const std::int64_t first = writer.appendCalls(calls[static_cast<std::size_t>(rank)]);
    std::vector<std::int64_t> ids;
    for (std::size_t i = 0; i < calls[static_cast<std::size_t>(rank)].size(); ++i)
      ids.push_back(first + static_cast<std::int64_t>(i));
    trace.ids.push_back(ids);
  }
  writer.finish(700'000);
  return trace;
}

TextMetrics fixedText() {
  return {14, [](const QString& text) { return 7 * static_cast<int>(text.size()); }};
}
}  // namespace

class ModelsTest : public QObject {
  Q_OBJECT
 private:
  QTemporaryDir dir_;
  std::string trace_;
  std::vector<storage::CallRecord> calls_;

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    trace_ = gui::testing::writeTestTrace(dir_.filePath(QStringLiteral("trace.db")).toStdString());
    const storage::TraceReader reader = storage::TraceReader::open(trace_);
    reader.forEachCall([this](const storage::CallRecord& call) {
      calls_.push_back(call);
      return true;
    });
    QVERIFY(calls_.size() > 3 * kCallsPageSize);
  }

  // The status bar's account of dropped events (trace_data.h summarizeDrops): "none" means none, calls
  // that are missing are counted as such, every kind is explained in the tooltip.
  void dropSummarySaysWhatIsMissing() {
    const DropSummary none = summarizeDrops({});
    QCOMPARE(QString::fromStdString(none.text), QStringLiteral("nothing dropped"));
    QCOMPARE(none.calls_lost, std::int64_t{0});
    const DropSummary lost =
        summarizeDrops({{0, "recording_stopped", 1200}, {1, "recording_stopped", 4}, {1, "gpu_timing", 3}});
    QCOMPARE(QString::fromStdString(lost.text), QStringLiteral("1,204 calls not recorded"));
    QCOMPARE(lost.events, std::int64_t{1207});
    QVERIFY(lost.details.find("1,204 × recording_stopped: calls not recorded: recording stopped after an "
                              "error") != std::string::npos);
    QVERIFY(lost.details.find("3 × gpu_timing: calls timed on the host") != std::string::npos);
    const DropSummary detail = summarizeDrops({{0, "gpu_timing", 1}});
    QCOMPARE(QString::fromStdString(detail.text), QStringLiteral("1 event dropped"));
    QCOMPARE(detail.calls_lost, std::int64_t{0});
  }

  void callsPagesFollowTheSortOrder_data() {
    QTest::addColumn<int>("column");
    QTest::addColumn<bool>("descending");
    QTest::newRow("id") << static_cast<int>(CallColumn::Id) << false;
    QTest::newRow("duration, longest first") << static_cast<int>(CallColumn::Duration) << true;
    QTest::newRow("bytes") << static_cast<int>(CallColumn::Bytes) << false;
    QTest::newRow("step") << static_cast<int>(CallColumn::Step) << false;
    QTest::newRow("start, latest first") << static_cast<int>(CallColumn::Start) << true;
    QTest::newRow("rank") << static_cast<int>(CallColumn::Rank) << false;
  }
  void callsPagesFollowTheSortOrder() {
    QFETCH(int, column);
    QFETCH(bool, descending);
    CallsModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    const storage::TraceReader reader = storage::TraceReader::open(trace_);
    model.setTrace(trace_, reader.ranks());
    CallsQuery query;
    query.filter.visible_window_only = false;
    model.setQuery(query);
    QTRY_VERIFY_WITH_TIMEOUT(!model.loading(), 30000);
    model.sort(column, descending ? Qt::DescendingOrder : Qt::AscendingOrder);
    fetchAll(model);
    QCOMPARE(model.rowCount(), static_cast<int>(calls_.size()));
    QTRY_VERIFY(model.matchingCalls().has_value());
    QCOMPARE(*model.matchingCalls(), static_cast<std::int64_t>(calls_.size()));
    // Expected: a plain sort by (key, id) of every call.
    std::vector<storage::CallRecord> expected = calls_;
    auto key = [column](const storage::CallRecord& c) -> std::int64_t {
      switch (static_cast<CallColumn>(column)) {
        case CallColumn::Duration: return c.end_ns - c.start_ns;
        case CallColumn::Bytes: return c.bytes;
        case CallColumn::Step: return c.step;
        case CallColumn::Start: return c.start_ns;
        case CallColumn::Rank: return c.rank_id;
        default: return c.id;
      }
    };
    std::sort(expected.begin(), expected.end(), [&](const auto& a, const auto& b) {
      const auto ka = std::make_pair(key(a), a.id);
      const auto kb = std::make_pair(key(b), b.id);
      return descending ? kb < ka : ka < kb;
    });
    for (int row = 0; row < model.rowCount(); ++row) {
      QCOMPARE(model.rowAt(row)->call.id, expected[static_cast<std::size_t>(row)].id);
    }
    QCOMPARE(model.data(model.index(0, 0), CallsModel::CallIdRole).toLongLong(), expected.front().id);
  }

  void callsFilters_data() {
    QTest::addColumn<int>("which");
    QTest::newRow("api") << 0;
    QTest::newRow("rank") << 1;
    QTest::newRow("size range") << 2;
    QTest::newRow("step") << 3;
    QTest::newRow("time window") << 4;
    QTest::newRow("everything at once") << 5;
  }
  void callsFilters() {
    QFETCH(int, which);
    CallsQuery query;
    query.filter.visible_window_only = false;
    if (which == 0) query.filter.api = Api::MpiAllgather;
    if (which == 1 || which == 5) query.filter.rank_id = 2;
    if (which == 2) {
      query.filter.min_bytes = 1 << 20;
      query.filter.max_bytes = 8 << 20;
    }
    if (which == 3 || which == 5) query.filter.step = 4;
    if (which == 5) query.filter.min_bytes = 1024;
    std::int64_t begin = calls_[calls_.size() / 3].start_ns, end = begin + 40'000'000;
    if (which == 4) query.window = TimeRange{static_cast<double>(begin), static_cast<double>(end)};
    std::int64_t expected = 0;
    for (const storage::CallRecord& c : calls_) {
      if (!query.filter.matches(c.api, c.rank_id, c.bytes, c.step)) continue;
      if (query.window && !(c.start_ns < end && c.end_ns > begin)) continue;
      ++expected;
    }
    QVERIFY(expected > 0);
    CallsModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setTrace(trace_, storage::TraceReader::open(trace_).ranks());
    model.setQuery(query);
    fetchAll(model);
    QCOMPARE(model.rowCount(), static_cast<int>(expected));
    QTRY_VERIFY(model.matchingCalls().has_value());
    QCOMPARE(*model.matchingCalls(), expected);
  }

  void staleCallPagesAreDropped() {
    CallsModel model;
    model.setTrace(trace_, storage::TraceReader::open(trace_).ranks());
    CallsQuery rank0;
    rank0.filter.visible_window_only = false;
    rank0.filter.rank_id = 0;
    CallsQuery rank3 = rank0;
    rank3.filter.rank_id = 3;
    model.setQuery(rank0);
    model.setQuery(rank3);  // before rank 0's page arrives
    QTRY_VERIFY_WITH_TIMEOUT(!model.loading() && model.rowCount() > 0, 30000);
    QTest::qWait(100);
    for (int row = 0; row < model.rowCount(); ++row)
      QCOMPARE(model.rowAt(row)->call.rank_id, std::int64_t{3});
  }

  // A CUDA graph replay shares its captured call's seq; the Seq column says which replay it is.
  void graphReplaysSayWhichReplayTheyAre() {
    const std::string path = dir_.filePath(QStringLiteral("replays.db")).toStdString();
    QVERIFY(QFile::copy(QString::fromStdString(trace_), QString::fromStdString(path)));
    gui::testing::exec(path, "INSERT OR REPLACE INTO gpu_calls (call_id, stream, replay) VALUES (2, 0, 3)");
    CallsModel model;
    model.setTrace(path, storage::TraceReader::open(path).ranks());
    CallsQuery query;
    query.filter.visible_window_only = false;
    model.setQuery(query);
    QTRY_VERIFY_WITH_TIMEOUT(!model.loading() && model.rowCount() > 2, 30000);
    const int seq = static_cast<int>(CallColumn::Seq);
    QCOMPARE(model.data(model.index(1, seq)).toString(), QStringLiteral("%1 · replay 3").arg(calls_[1].seq));
    QCOMPARE(model.data(model.index(0, seq)).toLongLong(), static_cast<qint64>(calls_[0].seq));
  }

  void aCorruptedFileIsAnErrorNotACrash() {
    QTemporaryDir dir;
    const std::string path = gui::testing::writeTruncatedTrace(dir);
    CallsModel model;
    model.setTrace(path, {});
    CallsQuery query;
    query.filter.visible_window_only = false;
    model.setQuery(query);
    QTRY_VERIFY_WITH_TIMEOUT(!model.loading(), 30000);
    // Either the pages that could be read or an error; never a crash.
    QVERIFY(model.rowCount() >= 0);
  }

  void strategiesAggregatePerSize() {
    const std::vector<StrategyPoint> points =
        aggregateMeasurements(storage::TraceReader::open(trace_).measurements());
    QCOMPARE(points.size(), std::size_t{12});
    const StrategyPoint& first = points.front();  // sum/native at 4 KiB
    QCOMPARE(first.strategy, std::string("sum/native"));
    QCOMPARE(first.bytes, std::int64_t{4096});
    QCOMPARE(first.rows, 8);
    const double base = 20e3 + 4096 * 0.4;
    QVERIFY(std::abs(first.median_ns - base * 1.035) < 1e-6);  // median of base × (1.00 .. 1.07)
    QVERIFY(std::abs(first.min_ns - base * 0.95) < 1e-6);
    QVERIFY(std::abs(first.max_ns - base * 1.07 * 1.2) < 1e-6);
    StrategiesModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setPoints(points);
    QCOMPARE(model.rowCount(), 12);
    QCOMPARE(model.data(model.index(0, StrategiesModel::ColStrategy)).toString(),
             QStringLiteral("sum/native"));
    QCOMPARE(model.data(model.index(0, StrategiesModel::ColBytes), kSortRole).toLongLong(), qint64{4096});
  }

  void paretoFront_data() {
    QTest::addColumn<QVector<double>>("times");
    QTest::addColumn<QVector<double>>("errors");
    QTest::addColumn<QVector<bool>>("front");
    QTest::newRow("trade-off") << QVector<double>{1, 2, 3} << QVector<double>{3, 2, 1}
                               << QVector<bool>{true, true, true};
    QTest::newRow("dominated") << QVector<double>{1, 2, 3} << QVector<double>{1, 2, 3}
                               << QVector<bool>{true, false, false};
    QTest::newRow("ties stay") << QVector<double>{1, 1} << QVector<double>{2, 2} << QVector<bool>{true, true};
    QTest::newRow("same time, worse error")
        << QVector<double>{1, 1, 0.5} << QVector<double>{1, 2, 5} << QVector<bool>{true, false, true};
  }
  void paretoFront() {
    QFETCH(QVector<double>, times);
    QFETCH(QVector<double>, errors);
    QFETCH(QVector<bool>, front);
    std::vector<std::pair<double, double>> points;
    for (qsizetype i = 0; i < times.size(); ++i) points.emplace_back(times[i], errors[i]);
    const std::vector<bool> result = gradscope::gui::paretoFront(points);
    QCOMPARE(QVector<bool>(result.begin(), result.end()), front);
  }

  void consensusModel() {
    ConsensusModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    std::vector<ConsensusRow> rows;
    for (storage::ConsensusRecord& r : storage::TraceReader::open(trace_).consensus()) {
      rows.push_back({r, static_cast<int>(r.rank_id)});
    }
    model.setRows(rows);
    QCOMPARE(model.rowCount(), 40 * 4);
    QCOMPARE(model.data(model.index(0, ConsensusModel::ColStep)).toLongLong(), qint64{0});
    QVERIFY(model.data(model.index(0, ConsensusModel::ColAlpha), kSortRole).toDouble() > 0);
  }

  // The charts' series: one point per rank and step, the mean of that step's rows, steps sorted whatever
  // the rows' order; every row's value kept for the dots.
  void consensusSeriesPerStep() {
    const auto row = [](int rank, std::int64_t step, double alpha, double cosine, double diversity) {
      ConsensusRow r;
      r.rank = rank;
      r.record.rank_id = rank + 10;
      r.record.step = step;
      r.record.alpha = alpha;
      r.record.cosine_to_mean = cosine;
      r.record.diversity = diversity;
      return r;
    };
    // Step 7 comes first and has three explored buffers on rank 0, two on rank 1; step 3 has one each.
    const std::vector<ConsensusRow> rows = {
        row(0, 7, 0.1, 0.9, 1.0), row(1, 7, 0.3, 0.5, 1.0), row(0, 7, 0.2, 0.8, 2.0),
        row(0, 7, 0.6, 0.4, 3.0), row(1, 7, 0.5, 0.7, 2.0), row(0, 3, 0.4, 0.6, 1.5),
        row(1, 3, 0.6, 0.2, 1.5),
    };
    const ConsensusSeries series = consensusSeries(rows);
    QVERIFY(series.steps_known);
    QCOMPARE(series.alpha.size(), std::size_t{2});
    const std::vector<ConsensusPoint>& alpha0 = series.alpha.at(0);
    QCOMPARE(alpha0.size(), std::size_t{2});
    QCOMPARE(alpha0[0].x, std::int64_t{3});
    QCOMPARE(alpha0[0].mean, 0.4);
    QCOMPARE(alpha0[1].x, std::int64_t{7});
    QCOMPARE(alpha0[1].values, (std::vector<double>{0.1, 0.2, 0.6}));
    QVERIFY(std::abs(alpha0[1].mean - 0.3) < 1e-12);
    QVERIFY(std::abs(series.alpha.at(1)[1].mean - 0.4) < 1e-12);
    QVERIFY(std::abs(series.cosine.at(0)[1].mean - 0.7) < 1e-12);
    QVERIFY(std::abs(series.cosine.at(1)[1].mean - 0.6) < 1e-12);
    // Diversity: one point per step, the mean over the step's rows of every rank.
    QCOMPARE(series.diversity.size(), std::size_t{2});
    QCOMPARE(series.diversity[0].x, std::int64_t{3});
    QCOMPARE(series.diversity[0].mean, 1.5);
    QCOMPARE(series.diversity[1].values.size(), std::size_t{5});
    QVERIFY(std::abs(series.diversity[1].mean - 1.8) < 1e-12);

    // No known step: x is the row's index within its rank.
    std::vector<ConsensusRow> unknown = {row(0, -1, 0.1, 0.9, 1.0), row(1, -1, 0.3, 0.5, 1.0),
                                         row(0, -1, 0.2, 0.8, 2.0)};
    const ConsensusSeries by_index = consensusSeries(unknown);
    QVERIFY(!by_index.steps_known);
    QCOMPARE(by_index.alpha.at(0).size(), std::size_t{2});
    QCOMPARE(by_index.alpha.at(0)[1].x, std::int64_t{1});
    QCOMPARE(by_index.alpha.at(0)[1].mean, 0.2);
    QCOMPARE(by_index.diversity[0].mean, 1.0);
    QCOMPARE(by_index.diversity[1].mean, 2.0);
    // A row without a step among rows with steps is left out.
    unknown.push_back(row(1, 4, 0.5, 0.5, 1.0));
    const ConsensusSeries mixed = consensusSeries(unknown);
    QCOMPARE(mixed.alpha.size(), std::size_t{1});
    QCOMPARE(mixed.diversity.size(), std::size_t{1});
    QVERIFY(consensusSeries({}).diversity.empty());
  }

  void recommendationModel() {
    const tuner::Result result = tuner::recommend(tuner::readInputs({trace_}), {});
    RecommendationModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setRows(result.report.sizes);
    QVERIFY(model.rowCount() > 0);
    for (int row = 0; row < model.rowCount(); ++row) {
      QVERIFY(!model.data(model.index(row, RecommendationModel::ColBest)).toString().isEmpty());
    }
  }

  // Two async strategies built by hand on a replayed synchronous step of 50 ms: async/stale1 measured
  // (errors and samples), async/stale2 not ("–"); the chosen one is bold; sorting on the numbers.
  void asyncOptionsModel() {
    tuner::AsyncAnalysis analysis;
    analysis.steps = 20;
    analysis.ranks = 4;
    analysis.step_ns = 52e6;
    analysis.replay_sync_ns = 50e6;
    tuner::AsyncOption measured;
    measured.strategy = "async/stale1";
    measured.staleness = 1;
    measured.step_ns = 40.85e6;
    measured.saving_ns = 9.15e6;  // 18.3 % of the synchronous step
    measured.saving_low_ns = 8.45e6;
    measured.saving_high_ns = 9.55e6;
    measured.error_median = 0.012;
    measured.error_worst = 0.5;
    measured.error_samples = 28;
    tuner::AsyncOption unmeasured;
    unmeasured.strategy = "async/stale2";
    unmeasured.staleness = 2;
    unmeasured.step_ns = 51e6;
    unmeasured.saving_ns = -1e6;  // slower: +2.0 %
    unmeasured.saving_low_ns = -2e6;
    unmeasured.saving_high_ns = 0.5e6;
    analysis.options = {measured, unmeasured};

    AsyncOptionsModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setAnalysis(analysis, "async/stale1");
    QCOMPARE(model.rowCount(), 2);
    QCOMPARE(model.columnCount(), int{AsyncOptionsModel::ColumnCount});
    QCOMPARE(model.headerData(AsyncOptionsModel::ColOnStep, Qt::Horizontal).toString(),
             QStringLiteral("On the step [95%]"));
    const auto text = [&](const QAbstractItemModel& m, int row, int column) {
      return m.data(m.index(row, column)).toString();
    };
    QCOMPARE(text(model, 0, AsyncOptionsModel::ColStrategy), QStringLiteral("async/stale1"));
    QCOMPARE(text(model, 0, AsyncOptionsModel::ColStep), QString::fromStdString(formatDuration(40.85e6)));
    QCOMPARE(text(model, 0, AsyncOptionsModel::ColOnStep),
             QStringLiteral("\u221218.3 % [\u221219.1, \u221216.9]"));
    QCOMPARE(text(model, 0, AsyncOptionsModel::ColErrorMedian), QStringLiteral("1.20e-02"));
    QCOMPARE(text(model, 0, AsyncOptionsModel::ColErrorWorst), QStringLiteral("5.00e-01"));
    QCOMPARE(text(model, 0, AsyncOptionsModel::ColSamples), QStringLiteral("28"));
    QCOMPARE(text(model, 1, AsyncOptionsModel::ColStrategy), QStringLiteral("async/stale2"));
    QCOMPARE(text(model, 1, AsyncOptionsModel::ColOnStep), QStringLiteral("+2.0 % [\u22121.0, +4.0]"));
    for (const int column : {int{AsyncOptionsModel::ColErrorMedian}, int{AsyncOptionsModel::ColErrorWorst},
                             int{AsyncOptionsModel::ColSamples}}) {
      QCOMPARE(text(model, 1, column), QStringLiteral("–"));
    }
    // Surely faster: green; an interval across zero: plain.
    QCOMPARE(
        model.data(model.index(0, AsyncOptionsModel::ColOnStep), Qt::ForegroundRole).value<QBrush>().color(),
        QColor(0x2e, 0x7d, 0x32));
    QVERIFY(!model.data(model.index(1, AsyncOptionsModel::ColOnStep), Qt::ForegroundRole).isValid());

    // The choice is bold in every column, the other row is not.
    for (int column = 0; column < model.columnCount(); ++column) {
      QVERIFY(model.data(model.index(0, column), Qt::FontRole).value<QFont>().bold());
      QVERIFY(!model.data(model.index(1, column), Qt::FontRole).isValid());
    }
    model.setAnalysis(analysis, {});
    QVERIFY(!model.data(model.index(0, AsyncOptionsModel::ColStrategy), Qt::FontRole).isValid());
    model.setAnalysis(analysis, "async/stale2");
    QVERIFY(model.data(model.index(1, AsyncOptionsModel::ColStrategy), Qt::FontRole).value<QFont>().bold());
    QVERIFY(!model.data(model.index(0, AsyncOptionsModel::ColStrategy), Qt::FontRole).isValid());

    // Sorting on the raw numbers, as the view's table does (makeSortedTable: a proxy on kSortRole).
    QSortFilterProxyModel proxy;
    proxy.setSourceModel(&model);
    proxy.setSortRole(kSortRole);
    proxy.sort(AsyncOptionsModel::ColOnStep, Qt::AscendingOrder);
    QCOMPARE(text(proxy, 0, AsyncOptionsModel::ColStrategy), QStringLiteral("async/stale1"));
    proxy.sort(AsyncOptionsModel::ColStep, Qt::DescendingOrder);
    QCOMPARE(text(proxy, 0, AsyncOptionsModel::ColStrategy), QStringLiteral("async/stale2"));
    // An unmeasured error sorts as less than any measured one.
    proxy.sort(AsyncOptionsModel::ColErrorMedian, Qt::AscendingOrder);
    QCOMPARE(text(proxy, 0, AsyncOptionsModel::ColStrategy), QStringLiteral("async/stale2"));
    proxy.sort(AsyncOptionsModel::ColSamples, Qt::DescendingOrder);
    QCOMPARE(text(proxy, 0, AsyncOptionsModel::ColStrategy), QStringLiteral("async/stale1"));

    model.clear();
    QCOMPARE(model.rowCount(), 0);
  }

  void checkModelShowsTheRegression() {
    QTemporaryDir dir;
    const std::string slow = gui::testing::writeTestTrace(
        dir.filePath(QStringLiteral("slow.db")).toStdString(), gui::testing::TraceOptions{4, 40, 1.5, true});
    const tuner::CheckResult result = tuner::checkTraces(trace_, slow);
    QVERIFY(result.count(tuner::Verdict::Regression) > 0);
    CheckModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setComparisons(result.comparisons);
    QCOMPARE(model.rowCount(), static_cast<int>(result.comparisons.size()));
    QCOMPARE(model.data(model.index(0, CheckModel::ColVerdict)).toString(), QStringLiteral("regression"));
  }

  // Two observe runs (no measurements), the second with twice the gradients: the check compares them
  // step by step, and the model shows each figure in the check's order, the step time first, its
  // verdict coloured as CheckModel colours it.
  void runComparisonModelShowsTheRunsStepByStep() {
    QTemporaryDir dir;
    const gui::testing::ObservedRuns observed = gui::testing::writeObservedRuns(dir);
    const tuner::CheckResult result = tuner::checkTraces(observed.before, observed.after);
    QVERIFY(result.comparisons.empty());
    QVERIFY(result.runs.size() >= 5);
    RunComparisonModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setRuns(result.runs);
    QCOMPARE(model.rowCount(), static_cast<int>(result.runs.size()));
    QCOMPARE(model.columnCount(), int{RunComparisonModel::ColumnCount});
    QCOMPARE(model.headerData(RunComparisonModel::ColBaseline, Qt::Horizontal).toString(),
             QStringLiteral("Baseline / step"));
    const auto text = [&](int row, int column) { return model.data(model.index(row, column)).toString(); };
    QCOMPARE(text(0, RunComparisonModel::ColFigure), QStringLiteral("step time"));
    QCOMPARE(text(0, RunComparisonModel::ColVerdict), QStringLiteral("regression"));
    QVERIFY(text(0, RunComparisonModel::ColChange).startsWith(QLatin1Char('+')));
    QVERIFY(model.data(model.index(0, RunComparisonModel::ColCurrent), kSortRole).toDouble() >
            model.data(model.index(0, RunComparisonModel::ColBaseline), kSortRole).toDouble());
    QVERIFY(model.data(model.index(0, RunComparisonModel::ColCurrent), Qt::ToolTipRole)
                .toString()
                .contains(QStringLiteral("40 steps")));
    // Every row: the check's figure and verdict, coloured like CheckModel's rows (unchanged: plain).
    const std::map<tuner::Verdict, QColor> colours = {{tuner::Verdict::Regression, QColor(0xc6, 0x28, 0x28)},
                                                      {tuner::Verdict::Improvement, QColor(0x2e, 0x7d, 0x32)},
                                                      {tuner::Verdict::Noisy, QColor(0xb2, 0x6b, 0x00)}};
    for (int row = 0; row < model.rowCount(); ++row) {
      const tuner::RunComparison& figure = result.runs[static_cast<std::size_t>(row)];
      QCOMPARE(text(row, RunComparisonModel::ColFigure), QString::fromStdString(figure.what));
      QCOMPARE(text(row, RunComparisonModel::ColVerdict), QString::fromUtf8(tuner::name(figure.verdict)));
      QCOMPARE(text(row, RunComparisonModel::ColEvidence), QString::fromStdString(figure.reason));
      for (const int column : {int{RunComparisonModel::ColVerdict}, int{RunComparisonModel::ColChange}}) {
        const QVariant brush = model.data(model.index(row, column), Qt::ForegroundRole);
        const auto colour = colours.find(figure.verdict);
        if (colour == colours.end()) {
          QVERIFY(!brush.isValid());
        } else {
          QCOMPARE(brush.value<QBrush>().color(), colour->second);
        }
      }
      QVERIFY(!model.data(model.index(row, RunComparisonModel::ColFigure), Qt::ForegroundRole).isValid());
    }
    // The same colours as the measured keys' table.
    CheckModel keys;
    const tuner::CheckResult measured = tuner::checkTraces(
        trace_, gui::testing::writeTestTrace(dir.filePath(QStringLiteral("slow.db")).toStdString(),
                                             gui::testing::TraceOptions{4, 40, 1.5, true}));
    keys.setComparisons(measured.comparisons);
    QCOMPARE(keys.data(keys.index(0, CheckModel::ColVerdict)).toString(), QStringLiteral("regression"));
    QCOMPARE(keys.data(keys.index(0, CheckModel::ColVerdict), Qt::ForegroundRole).value<QBrush>().color(),
             colours.at(tuner::Verdict::Regression));
    model.setRuns({});
    QCOMPARE(model.rowCount(), 0);
  }

  void timelineFrames() {
    const storage::TraceReader reader = storage::TraceReader::open(trace_);
    const TraceInfo info = loadTraceInfo(reader);
    QCOMPARE(info.calls, static_cast<std::int64_t>(calls_.size()));
    QCOMPARE(info.ranks.size(), std::size_t{4});
    QCOMPARE(info.measurements, std::int64_t{96});
    QVERIFY(!info.extent.empty());
    // Few calls: detailed, every call of the window present.
    const TimelineFrame detailed = loadTimelineFrame(reader, info.extent, 800, true);
    QVERIFY(detailed.detailed);
    std::size_t drawn = 0;
    for (const auto& [rank, calls] : detailed.calls) drawn += calls.size();
    QCOMPARE(drawn, calls_.size());
    QCOMPARE(detailed.strategies.size(), std::size_t{10});
    // Over the limit: buckets only, one per column.
    const TimelineFrame aggregated = loadTimelineFrame(reader, info.extent, 800, false, 10);
    QVERIFY(!aggregated.detailed);
    QCOMPARE(aggregated.summary.columns, 800);
    QCOMPARE(aggregated.window_calls, static_cast<std::int64_t>(calls_.size()));
  }

  // The messages the timeline draws: each send joined to its receive, with both calls' rows and times;
  // a call finds its messages (two for an MPI_Sendrecv), a collective none.
  void peerFlowsJoinSendsToTheirReceives() {
    const PeerTrace trace = writePeerTrace(dir_.filePath(QStringLiteral("peers-flows.db")).toStdString());
    const storage::TraceReader reader = storage::TraceReader::open(trace.path);
    const PeerFlows flows = loadPeerFlows(reader);
    QCOMPARE(flows.all().size(), std::size_t{6});
    QCOMPARE(flows.unmatched(), std::int64_t{0});
    QCOMPARE(flows.unresolved(), std::int64_t{0});
    for (std::size_t i = 1; i < flows.all().size(); ++i)
      QVERIFY(flows.all()[i - 1].send_call_id <= flows.all()[i].send_call_id);
    const auto& ids = trace.ids;
    const std::vector<const PeerFlow*> second = flows.of(ids[0][1]);
    QCOMPARE(second.size(), std::size_t{1});
    QCOMPARE(second[0]->recv_call_id, ids[1][1]);  // the second send, the second receive
    QCOMPARE(second[0]->send_end_ns, std::int64_t{110'000});
    QCOMPARE(second[0]->recv_end_ns, std::int64_t{120'000});
    QCOMPARE(second[0]->bytes, std::int64_t{4096});
    QCOMPARE(second[0]->from_rank, 0);
    QCOMPARE(second[0]->to_rank, 1);
    QCOMPARE(flows.of(ids[1][1]).size(), std::size_t{1});
    QCOMPARE(flows.of(ids[1][1])[0]->send_call_id, ids[0][1]);
    const std::vector<const PeerFlow*> nonblocking = flows.of(ids[2][0]);
    QCOMPARE(nonblocking.size(), std::size_t{1});
    QCOMPARE(nonblocking[0]->send_call_id, ids[1][2]);
    QCOMPARE(nonblocking[0]->send_start_ns, std::int64_t{250'000});
    const std::vector<const PeerFlow*> exchange = flows.of(ids[2][1]);
    QCOMPARE(exchange.size(), std::size_t{2});
    QCOMPARE(exchange[0]->send_call_id, ids[2][1]);
    QCOMPARE(exchange[0]->recv_call_id, ids[3][0]);
    QCOMPARE(exchange[1]->send_call_id, ids[3][0]);
    QCOMPARE(exchange[1]->recv_call_id, ids[2][1]);
    QVERIFY(flows.of(ids[0].back()).empty());                            // the all-reduce
    QVERIFY(loadPeerFlows(storage::TraceReader::open(trace_)).empty());  // collectives only
  }

  // The communication matrix of the four ranks, cell by cell, by bytes and by time.
  void commMatrixCells() {
    const PeerTrace trace = writePeerTrace(dir_.filePath(QStringLiteral("peers-matrix.db")).toStdString());
    CommMatrixModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QVERIFY(model.empty());
    model.setMatrix(storage::peerMatrix(storage::TraceReader::open(trace.path)));
    QCOMPARE(model.rowCount(), 4);
    QCOMPARE(model.columnCount(), 4);
    QVERIFY(!model.empty());
    QCOMPARE(model.headerData(2, Qt::Vertical).toString(), QStringLiteral("rank 2"));
    QCOMPARE(model.headerData(3, Qt::Horizontal).toString(), QStringLiteral("peer 3"));
    const auto cell = [&](int rank, int peer, int role) { return model.data(model.index(rank, peer), role); };
    // Bytes: what the row's rank sent to the column's.
    const double kib = 1024, mib = 1024 * kib;
    const double bytes[4][4] = {
        {0, 8 * kib, 0, 0}, {0, 0, mib, 0}, {0, 0, 0, 64 * kib}, {512, 0, 64 * kib, 0}};
    for (int r = 0; r < 4; ++r)
      for (int p = 0; p < 4; ++p) QCOMPARE(cell(r, p, CommMatrixModel::kValueRole).toDouble(), bytes[r][p]);
    QCOMPARE(cell(0, 1, Qt::DisplayRole).toString(), QStringLiteral("8 KiB"));
    QCOMPARE(cell(1, 0, Qt::DisplayRole).toString(), QString());
    QCOMPARE(model.maxValue(), mib);
    QCOMPARE(cell(1, 2, Qt::BackgroundRole).value<QBrush>().color(), matrixColour(1.0));
    QCOMPARE(cell(1, 0, Qt::BackgroundRole).value<QBrush>().color(), matrixColour(0));
    QVERIFY(cell(3, 0, Qt::BackgroundRole).value<QBrush>().color() != matrixColour(0));  // 512 B: a tint
    QCOMPARE(cell(1, 2, Qt::ForegroundRole).value<QBrush>().color(), QColor(Qt::white));
    const QString tip = cell(2, 3, Qt::ToolTipRole).toString();
    QVERIFY2(tip.contains(QStringLiteral("rank 2 ↔ peer 3")), qPrintable(tip));
    QVERIFY2(tip.contains(QStringLiteral("sent 64 KiB in 1 send (20.0 us)")), qPrintable(tip));
    QVERIFY2(tip.contains(QStringLiteral("received 64 KiB in 1 receive (20.0 us)")), qPrintable(tip));
    QVERIFY2(tip.contains(QStringLiteral("1 point-to-point call in all")), qPrintable(tip));
    QVERIFY(cell(1, 0, Qt::ToolTipRole)
                .toString()
                .contains(QStringLiteral("received 8 KiB in 2 receives (60.0 us)")));

    // Time: sending to the peer plus receiving from it (a Sendrecv in both).
    QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
    model.setMetric(MatrixMetric::Time);
    QCOMPARE(changed.count(), 1);
    const double us = 1000;
    const double time[4][4] = {{0, 20 * us, 0, 7 * us},
                               {60 * us, 0, 50 * us, 0},
                               {0, 100 * us, 0, 40 * us},
                               {5 * us, 0, 50 * us, 0}};
    for (int r = 0; r < 4; ++r)
      for (int p = 0; p < 4; ++p) QCOMPARE(cell(r, p, CommMatrixModel::kValueRole).toDouble(), time[r][p]);
    QCOMPARE(cell(1, 0, Qt::DisplayRole).toString(), QStringLiteral("60.0 us"));
    QCOMPARE(model.maxValue(), 100 * us);

    // The scene: a cell per pair that talked, each with its value; every rank labelled; what a point hits.
    const CommMatrixScene scene = buildCommMatrixScene(model, {900, 600}, fixedText());
    QVERIFY(!scene.message.has_value());
    QCOMPARE(scene.cells.size(), std::size_t{8});
    QCOMPARE(scene.label_step, 1);
    QCOMPARE(scene.row_labels.size(), std::size_t{4});
    QCOMPARE(scene.column_labels.size(), std::size_t{4});
    QCOMPARE(scene.grid.width(), 4 * scene.cell);
    QVERIFY(scene.grid.bottom() < 600 && scene.scale.left() > scene.grid.right());
    for (const MatrixCell& c : scene.cells) {
      QVERIFY(c.text.has_value());
      QCOMPARE(c.text->text, model.valueText(model.value(c.rank, c.peer)));
      QVERIFY(c.rect.contains(c.text->rect.center()));
      QCOMPARE(scene.cellAt(c.rect.center()), (std::optional<std::pair<int, int>>{{c.rank, c.peer}}));
    }
    QCOMPARE(scene.cells[0].rank, 0);
    QCOMPARE(scene.cells[0].peer, 1);
    QCOMPARE(scene.cellAt({scene.grid.left() - 1, scene.grid.top()}), std::nullopt);
    QCOMPARE(scene.scale_labels.front().text, model.valueText(100 * us));
    QCOMPARE(scene.scale_labels.back().text, QStringLiteral("none"));
  }

  // Many ranks: colours only, labels as often as they fit; none at all: a message instead.
  void commMatrixScalesToManyRanks() {
    storage::PeerMatrix ring;
    ring.ranks = 200;
    const auto cells = static_cast<std::size_t>(200 * 200);
    for (auto* values :
         {&ring.sent_bytes, &ring.send_calls, &ring.send_ns, &ring.recv_ns, &ring.recv_calls, &ring.calls})
      values->assign(cells, 0);
    for (std::size_t r = 0; r < 200; ++r) {
      const std::size_t next = r * 200 + (r + 1) % 200;
      ring.sent_bytes[next] = static_cast<std::int64_t>(1000 * (r + 1));
      ring.send_calls[next] = ring.calls[next] = 1;
    }
    CommMatrixModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setMatrix(ring);
    const CommMatrixScene scene = buildCommMatrixScene(model, {900, 700}, fixedText());
    QCOMPARE(scene.cells.size(), std::size_t{200});
    QVERIFY(scene.cell >= 1);
    QVERIFY(scene.grid.right() < 900 && scene.grid.bottom() < 700);
    for (const MatrixCell& c : scene.cells) QVERIFY(!c.text.has_value());
    QVERIFY(scene.label_step > 1);
    QVERIFY(scene.label_step * scene.cell >= 14);  // labels do not overlap
    QCOMPARE(static_cast<int>(scene.row_labels.size()), (200 + scene.label_step - 1) / scene.label_step);
    // Up to kMatrixMaxTextRanks ranks the widget asks for cells of at least kMatrixMinCell.
    QVERIFY(commMatrixMinimumSize(64, fixedText()).height() >= 64 * kMatrixMinCell);

    CommMatrixModel none;
    storage::PeerMatrix quiet;
    quiet.ranks = 4;
    none.setMatrix(quiet);
    QVERIFY(none.empty());
    const CommMatrixScene empty = buildCommMatrixScene(none, {900, 700}, fixedText());
    QVERIFY(empty.message.has_value());
    QVERIFY(empty.cells.empty());
  }

  void jobsDropStaleResults() {
    QObject context;
    JobTracker tracker(&context);
    std::vector<int> delivered;
    tracker.run<int>(
        [] {
          QThread::msleep(50);
          return 1;
        },
        [&](Outcome<int> o) { delivered.push_back(*o.value); });
    tracker.run<int>([] { return 2; }, [&](Outcome<int> o) { delivered.push_back(*o.value); });
    QTRY_COMPARE(jobsInFlight(), 0);
    QCOMPARE(delivered, std::vector<int>{2});
    QString error;
    tracker.run<int>([]() -> int { throw std::runtime_error("broken file"); },
                     [&](Outcome<int> o) { error = o.error; });
    QTRY_COMPARE(error, QStringLiteral("broken file"));
  }
};

QTEST_MAIN(ModelsTest)
#include "models_test.moc"
