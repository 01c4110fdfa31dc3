// The viewer's item models (QAbstractItemModelTester on each), the paged calls query against a plain
// sort of every call, the measurement aggregation, the Pareto front and the timeline frame loader.

#include <algorithm>
#include <cmath>
#include <functional>

#include <QAbstractItemModelTester>
#include <QFile>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>

#include "gradscope/storage/reader.h"
#include "gradscope/tuner/check.h"
#include "gradscope/tuner/recommend.h"
#include "gui_test_support.h"
#include "models/analysis_models.h"
#include "models/calls_model.h"
#include "models/jobs.h"
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
