// The Steps tab: natural host order, the step breakdown of a merged synthetic job against the storage
// library's step totals (exact), cells per (rank, step) and their times on rank 0's clock, the scene at a
// few and at 1024 ranks and without steps, and the view: a click on a cell or a bar asks for that step
// on the timeline.

#include <algorithm>

#include <QAbstractItemModelTester>
#include <QMouseEvent>
#include <QTemporaryDir>
#include <QTest>

#include "gradscope/storage/merge.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/step_model.h"
#include "models/step_breakdown.h"
#include "synthetic_trace.h"
#include "widgets/steps_view.h"

using namespace gradscope;
using namespace gradscope::gui;

namespace {
TextMetrics fixedText() {
  return {14, [](const QString& text) { return 7 * static_cast<int>(text.size()); }};
}

// A hand-made breakdown: `ranks` ranks (rank r on host "node<r / per_host>"), `steps` steps of 1 ms each,
// rank r's step s exposing r + s microseconds.
StepBreakdown handMade(int ranks, int steps, int per_host = 8) {
  std::vector<storage::RankInfo> infos;
  std::vector<storage::StepRecord> rows;
  for (int r = 0; r < ranks; ++r) {
    storage::RankInfo info;
    info.id = r;
    info.rank = r;
    info.host = "node" + std::to_string(r / per_host);
    infos.push_back(info);
    for (int s = 0; s < steps; ++s) {
      storage::StepRecord row;
      row.rank_id = r;
      row.step = s;
      row.start_ns = s * 1'000'000;
      row.end_ns = row.start_ns + 1'000'000;
      row.exposed_ns = (r + s) * 1000;
      row.compute_ns = row.end_ns - row.start_ns - row.exposed_ns;
      row.calls = 1;
      rows.push_back(row);
    }
  }
  return buildStepBreakdown(std::move(infos), std::move(rows));
}
}  // namespace

class StepsTest : public QObject {
  Q_OBJECT

 private slots:
  void naturalOrder_data() {
    QTest::addColumn<QString>("a");
    QTest::addColumn<QString>("b");
    QTest::addColumn<int>("expected");
    QTest::newRow("digits by number") << "node2"
                                      << "node10" << -1;
    QTest::newRow("reversed") << "node10"
                              << "node2" << 1;
    QTest::newRow("equal") << "node7"
                           << "node7" << 0;
    QTest::newRow("prefix first") << "node"
                                  << "node1" << -1;
    QTest::newRow("letters") << "nodeA"
                             << "nodeB" << -1;
    QTest::newRow("several numbers") << "rack2-node10"
                                     << "rack10-node2" << -1;
    QTest::newRow("second number") << "rack2-node9"
                                   << "rack2-node10" << -1;
    QTest::newRow("leading zeros: same number, then the longer first") << "node007"
                                                                       << "node7" << -1;
    QTest::newRow("leading zeros: by number") << "node010"
                                              << "node9" << 1;
    QTest::newRow("longer than 64 bits") << "n123456789012345678901234567890"
                                         << "n99" << 1;
    QTest::newRow("empty") << ""
                           << "a" << -1;
  }
  void naturalOrder() {
    QFETCH(QString, a);
    QFETCH(QString, b);
    QFETCH(int, expected);
    QCOMPARE(compareNatural(a.toStdString(), b.toStdString()), expected);
    QCOMPARE(compareNatural(b.toStdString(), a.toStdString()), -expected);
    QCOMPARE(naturalLess(a.toStdString(), b.toStdString()), expected < 0);
  }

  void init() { QVERIFY(dir_.isValid()); }

  // Twelve ranks, one per host (node0 … node11), rank 1 the straggler, merged (steps detected): the bars
  // are exactly stepTotals' means, every (rank, step) has its row, hosts in natural order.
  void breakdownOfMergedJob() {
    testing::SyntheticJob job;
    job.ranks = 12;
    job.steps = 6;
    job.ranks_per_host = 1;
    std::vector<std::string> files;
    for (int r = 0; r < job.ranks; ++r) {
      files.push_back(dir_.filePath(QStringLiteral("rank%1.db").arg(r)).toStdString());
      testing::writeSyntheticRank(files.back(), job, r);
    }
    const std::string merged = dir_.filePath(QStringLiteral("merged.db")).toStdString();
    storage::mergeTraces(files, merged, {});
    const storage::TraceReader reader = storage::TraceReader::open(merged);
    const std::vector<storage::StepRecord> rows = storage::readOrComputeSteps(reader);
    const std::vector<storage::StepTotals> totals = storage::stepTotals(rows);
    QVERIFY(!rows.empty());

    StepBreakdownModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setBreakdown(loadStepBreakdown(reader));
    const StepBreakdown& b = model.breakdown();
    QCOMPARE(model.rowCount(), 12);
    QCOMPARE(b.steps.size(), totals.size());
    QCOMPARE(model.columnCount(), static_cast<int>(totals.size()));

    // Bars: compute + exposed-but-not-waiting + waiting, the means over ranks, exactly.
    for (std::size_t s = 0; s < totals.size(); ++s) {
      QCOMPARE(b.steps[s], totals[s].step);
      const StepParts parts = b.parts(static_cast<int>(s));
      QCOMPARE(parts.compute_ns, totals[s].compute_ns);
      QCOMPARE(parts.exposed_only_ns, totals[s].exposed_ns - totals[s].waiting_ns);
      QCOMPARE(parts.waiting_ns, totals[s].waiting_ns);
      QCOMPARE(parts.hidden_ns, totals[s].hidden_ns);
    }
    // Rows in rank order; hosts naturally (node2 before node10).
    for (int r = 0; r < 12; ++r) QCOMPARE(b.ranks[static_cast<std::size_t>(r)].rank, r);
    std::vector<std::string> hosts;
    for (int h = 0; h < 12; ++h) hosts.push_back("node" + std::to_string(h));
    QCOMPARE(b.hosts, hosts);
    QCOMPARE(model.headerData(11, Qt::Vertical).toString(), QStringLiteral("rank 11"));
    QCOMPARE(b.rankLabel(10), QStringLiteral("rank 10 · node10"));

    // Cells: one per row, each figure the row's, times moved onto rank 0's clock.
    const std::vector<storage::RankInfo> infos = reader.ranks();
    std::size_t cells = 0;
    for (const storage::StepRecord& row : rows) {
      const auto rank = std::find_if(b.ranks.begin(), b.ranks.end(),
                                     [&](const StepRank& x) { return x.rank_id == row.rank_id; });
      QVERIFY(rank != b.ranks.end());
      const int r = static_cast<int>(rank - b.ranks.begin());
      const int s = static_cast<int>(std::find(b.steps.begin(), b.steps.end(), row.step) - b.steps.begin());
      QVERIFY(b.cell(r, s) != nullptr);
      QCOMPARE(b.cell(r, s)->calls, row.calls);
      QCOMPARE(*b.value(r, s, StepFigure::Exposed), static_cast<double>(row.exposed_ns));
      QCOMPARE(*b.value(r, s, StepFigure::Waiting), static_cast<double>(row.waiting_ns));
      QCOMPARE(*b.value(r, s, StepFigure::StepTime), static_cast<double>(row.end_ns - row.start_ns));
      QCOMPARE(*b.value(r, s, StepFigure::Caused), static_cast<double>(row.caused_ns));
      const auto info = std::find_if(infos.begin(), infos.end(),
                                     [&](const storage::RankInfo& x) { return x.id == row.rank_id; });
      const TimeRange range = b.stepRange(s, r);
      QCOMPARE(range.begin_ns, static_cast<double>(row.start_ns + info->clock_offset_ns));
      QCOMPARE(range.end_ns, static_cast<double>(row.end_ns + info->clock_offset_ns));
      QVERIFY(b.stepRange(s).begin_ns <= range.begin_ns && b.stepRange(s).end_ns >= range.end_ns);
      const QModelIndex index = model.index(r, s);
      QCOMPARE(model.data(index, StepBreakdownModel::kValueRole).toDouble(),
               static_cast<double>(row.exposed_ns));
      QVERIFY(
          model.data(index, Qt::ToolTipRole).toString().contains(QStringLiteral("node%1").arg(rank->rank)));
      ++cells;
    }
    QCOMPARE(cells, static_cast<std::size_t>(std::count_if(b.cell_row.begin(), b.cell_row.end(),
                                                           [](std::int64_t i) { return i >= 0; })));

    // The straggler (rank 1) made the others wait: its caused row is the darkest on that heatmap.
    model.setFigure(StepFigure::Caused);
    double most = -1;
    int who = -1;
    for (int r = 0; r < 12; ++r) {
      double sum = 0;
      for (int s = 0; s < model.columnCount(); ++s) sum += b.value(r, s, StepFigure::Caused).value_or(0);
      if (sum > most) most = sum, who = r;
    }
    QCOMPARE(who, 1);
  }

  // Hosts compared naturally and ranks by number, whatever order the trace lists them in.
  void ranksAndHostsOrdered() {
    std::vector<storage::RankInfo> infos;
    std::vector<storage::StepRecord> rows;
    const std::pair<int, const char*> ranks[] = {{2, "node10"}, {0, "node9"}, {1, "node2"}, {3, "node2"}};
    for (const auto& [rank, host] : ranks) {
      storage::RankInfo info;
      info.id = 10 + rank;  // ids differ from ranks
      info.rank = rank;
      info.host = host;
      info.clock_offset_ns = 1000 * rank;
      infos.push_back(info);
      storage::StepRecord row;
      row.rank_id = info.id;
      row.step = 5;
      row.start_ns = 100;
      row.end_ns = 200;
      row.compute_ns = 100;
      rows.push_back(row);
    }
    const StepBreakdown b = buildStepBreakdown(infos, rows);
    for (int r = 0; r < 4; ++r) QCOMPARE(b.ranks[static_cast<std::size_t>(r)].rank, r);
    QCOMPARE(b.hosts, (std::vector<std::string>{"node2", "node9", "node10"}));
    QCOMPARE(b.stepRange(0, 3), (TimeRange{3100, 3200}));  // rank 3's offset added
    QCOMPARE(b.stepRange(0), (TimeRange{100, 3200}));
  }

  // GPU rows: a step outside the sampled windows has its time only (blank cells for the other figures, a
  // tooltip that says why); a measured one says the GPU was idle.
  void gpuSteps() {
    std::vector<storage::StepRecord> rows = handMade(2, 3).rows;
    for (storage::StepRecord& row : rows) {
      row.basis = row.step == 1 ? storage::StepBasis::GpuUnsampled : storage::StepBasis::Gpu;
      row.idle_ns = 250'000;
      if (row.step == 1) row.compute_ns = row.exposed_ns = 0;
    }
    std::vector<storage::RankInfo> infos(2);
    for (int r = 0; r < 2; ++r)
      infos[static_cast<std::size_t>(r)].id = infos[static_cast<std::size_t>(r)].rank = r;
    StepBreakdownModel model;
    model.setBreakdown(buildStepBreakdown(std::move(infos), std::move(rows)));
    // The bars: step 1's time as an outline, with its legend entry; the others stacked.
    const StepsScene scene = buildStepsScene(model, {1200, 800}, fixedText());
    const auto outlines = std::count_if(scene.segments.begin(), scene.segments.end(),
                                        [](const StepBarSegment& segment) { return segment.outline; });
    QCOMPARE(outlines, 1);
    QVERIFY(scene.outline_legend.has_value());
    const auto outline = std::find_if(scene.segments.begin(), scene.segments.end(),
                                      [](const StepBarSegment& segment) { return segment.outline; });
    QVERIFY(outline->rect.left() >= scene.columnLeft(1) && outline->rect.right() <= scene.columnRight(1));
    QVERIFY(!model.breakdown().value(0, 1, StepFigure::Exposed));
    QCOMPARE(*model.breakdown().value(0, 1, StepFigure::StepTime), 1e6);
    QVERIFY(model.breakdown().value(1, 2, StepFigure::Exposed).has_value());
    QVERIFY(model.cellToolTip(0, 1).contains(QStringLiteral("outside the agent's sampled GPU windows")));
    QVERIFY(model.cellToolTip(1, 2).contains(QStringLiteral("measured on the GPU: idle 250")));
  }

  // The scene: bars over the heatmap in shared columns, every rank labelled with its host when rows are
  // tall; at 1024 ranks a pixel row each, labels that do not touch; without steps, a message.
  void sceneLayout() {
    StepBreakdownModel model;
    model.setBreakdown(handMade(4, 10));
    const StepsScene scene = buildStepsScene(model, {1200, 800}, fixedText());
    QVERIFY(!scene.message);
    QCOMPARE(scene.cells.size(), std::size_t{40});
    QCOMPARE(scene.rank_labels.size(), std::size_t{4});
    QCOMPARE(scene.rank_labels[2].text, QStringLiteral("rank 2 · node0"));
    QVERIFY(scene.bars.bottom() < scene.heatmap.top());
    QCOMPARE(scene.bars.left(), scene.heatmap.left());
    QVERIFY(scene.scale.left() > scene.heatmap.right() && scene.scale_labels.back().rect.right() <= 1200);
    QCOMPARE(scene.step_labels.size(), std::size_t{10});
    for (const StepBarSegment& segment : scene.segments) QVERIFY(scene.bars.contains(segment.rect));
    QCOMPARE(scene.cellAt(scene.cells[7].rect.center()), (std::optional<std::pair<int, int>>{{0, 7}}));
    QCOMPARE(scene.barAt({scene.columnLeft(3) + 2, scene.bars.bottom() - 1}), std::optional<int>(3));

    StepBreakdownModel many;
    many.setBreakdown(handMade(1024, 10));
    const int height = stepsMinimumHeight(1024, fixedText());
    const StepsScene big = buildStepsScene(many, {1400, height}, fixedText());
    QCOMPARE(big.row_height, 1);
    QCOMPARE(big.cells.size(), std::size_t{10240});
    QVERIFY(big.heatmap.bottom() < height);
    QVERIFY(big.label_step * big.row_height >= 14);  // labels do not overlap
    QVERIFY(big.rank_labels.front().text == QStringLiteral("0"));
    QCOMPARE(big.cellAt({big.heatmap.left() + 1, big.heatmap.top() + 700}),
             (std::optional<std::pair<int, int>>{{700, 0}}));

    StepBreakdownModel none;
    QAbstractItemModelTester tester(&none, QAbstractItemModelTester::FailureReportingMode::QtTest);
    none.setBreakdown({});
    const StepsScene empty = buildStepsScene(none, {900, 700}, fixedText());
    QVERIFY(empty.message);
    QVERIFY(empty.message->text.contains(QStringLiteral("gradscope merge")));
    QVERIFY(empty.message->text.contains(QStringLiteral("no step markers")));
  }

  // A click on a cell asks for that rank's step on the timeline; on a bar, the step across ranks.
  void clickJumpsToStep() {
    StepsView view;
    view.resize(1100, 800);
    StepBreakdown data = handMade(4, 10);
    data.ranks[2].clock_offset_ns = 5000;
    view.setBreakdown(data);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    struct Jump {
      TimeRange range;
      std::int64_t rank_id, step;
    };
    std::vector<Jump> jumps;
    connect(&view, &StepsView::showOnTimeline, this,
            [&](TimeRange range, std::int64_t rank_id, std::int64_t step) {
              jumps.push_back({range, rank_id, step});
            });
    StepsWidget* chart = view.chart();
    const StepsScene& scene = chart->scene();
    QVERIFY(!scene.message);
    const auto cell = std::find_if(scene.cells.begin(), scene.cells.end(), [&](const StepBarSegment& c) {
      return scene.cellAt(c.rect.center()) == std::optional<std::pair<int, int>>{{2, 6}};
    });
    QVERIFY(cell != scene.cells.end());
    QTest::mouseClick(chart, Qt::LeftButton, {}, cell->rect.center());
    QCOMPARE(jumps.size(), std::size_t{1});
    QCOMPARE(jumps[0].rank_id, std::int64_t{2});
    QCOMPARE(jumps[0].step, std::int64_t{6});
    // Step 6 of rank 2 is [6 ms, 7 ms) on its clock, 5 us later on rank 0's; the window holds it with a
    // twentieth of it on each side.
    const TimeRange step{6'005'000, 7'005'000};
    QCOMPARE(jumps[0].range, (TimeRange{step.begin_ns - 50'000, step.end_ns + 50'000}));

    QTest::mouseClick(chart, Qt::LeftButton, {}, {scene.columnLeft(3) + 3, scene.bars.bottom() - 2});
    QCOMPARE(jumps.size(), std::size_t{2});
    QCOMPARE(jumps[1].rank_id, std::int64_t{-1});
    QCOMPARE(jumps[1].step, std::int64_t{3});
    QVERIFY(jumps[1].range.begin_ns < 3'000'000 && jumps[1].range.end_ns > 4'005'000);
  }

 private:
  QTemporaryDir dir_;
};

QTEST_MAIN(StepsTest)
#include "steps_test.moc"
