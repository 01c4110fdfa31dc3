// The zoom, selection and filter state shared by the views (gui/models/view_state.h).

#include "models/view_state.h"

#include <QSignalSpy>
#include <QTest>

using gradscope::gui::CallFilter;
using gradscope::gui::TimeRange;
using gradscope::gui::ViewState;

class ViewStateTest : public QObject {
  Q_OBJECT
 private slots:
  void extentResetsTheWindow() {
    ViewState state;
    QSignalSpy window(&state, &ViewState::windowChanged);
    state.setExtent({0, 1e9});
    QCOMPARE(state.window(), (TimeRange{0, 1e9}));
    QCOMPARE(window.count(), 1);
  }

  void windowIsClampedAndRecorded() {
    ViewState state;
    state.setExtent({0, 1e9});
    state.setWindow({-5e8, 1e8}, true);
    QCOMPARE(state.window(), (TimeRange{0, 6e8}));
    state.setWindow({1e8, 2e8}, true);
    QCOMPARE(state.historyDepth(), std::size_t{2});
    QVERIFY(state.zoomBack());
    QCOMPARE(state.window(), (TimeRange{0, 6e8}));
    QVERIFY(state.zoomBack());
    QCOMPARE(state.window(), (TimeRange{0, 1e9}));
    QVERIFY(!state.zoomBack());
    // Unrecorded changes (wheel, drag) leave the history alone.
    state.setWindow({1e8, 2e8});
    QCOMPARE(state.historyDepth(), std::size_t{0});
    state.resetZoom();
    QCOMPARE(state.window(), (TimeRange{0, 1e9}));
    QVERIFY(state.zoomBack());
    QCOMPARE(state.window(), (TimeRange{1e8, 2e8}));
  }

  void sameWindowSignalsNothing() {
    ViewState state;
    state.setExtent({0, 1e9});
    QSignalSpy window(&state, &ViewState::windowChanged);
    state.setWindow({0, 1e9});
    QCOMPARE(window.count(), 0);
  }

  void tinyWindowGrowsToTheMinimum() {
    ViewState state;
    state.setExtent({0, 1e9});
    state.setWindow({5000, 5010});
    QCOMPARE(state.window().length(), gradscope::gui::kMinWindowNs);
  }

  void liveExtentFollowsTheEnd() {
    ViewState state;
    state.setExtent({0, 1e9});
    // Showing everything: keeps showing everything.
    state.setExtent({0, 2e9}, true);
    QCOMPARE(state.window(), (TimeRange{0, 2e9}));
    // Showing the end: follows it with the same length.
    state.setWindow({1.5e9, 2e9});
    state.setExtent({0, 3e9}, true);
    QCOMPARE(state.window(), (TimeRange{2.5e9, 3e9}));
    // Looking at the past: stays there.
    state.setWindow({1e8, 2e8});
    state.setExtent({0, 4e9}, true);
    QCOMPARE(state.window(), (TimeRange{1e8, 2e8}));
  }

  void filterAndSelectionSignalOnChange() {
    ViewState state;
    QSignalSpy filter(&state, &ViewState::filterChanged);
    QSignalSpy selection(&state, &ViewState::selectionChanged);
    CallFilter f;
    f.api = gradscope::Api::MpiAllreduce;
    state.setFilter(f);
    state.setFilter(f);
    QCOMPARE(filter.count(), 1);
    state.setSelection(gradscope::gui::SelectedCall{7, 1, 100, 200});
    state.setSelection(gradscope::gui::SelectedCall{7, 1, 100, 200});
    QCOMPARE(selection.count(), 1);
    QCOMPARE(state.selection()->id, std::int64_t{7});
  }

  void filterMatches_data() {
    QTest::addColumn<int>("api");
    QTest::addColumn<qint64>("rank");
    QTest::addColumn<qint64>("bytes");
    QTest::addColumn<qint64>("step");
    QTest::addColumn<bool>("matches");
    const int allreduce = static_cast<int>(gradscope::Api::MpiAllreduce);
    const int bcast = static_cast<int>(gradscope::Api::MpiBcast);
    QTest::newRow("all match") << allreduce << qint64{1} << qint64{4096} << qint64{3} << true;
    QTest::newRow("other api") << bcast << qint64{1} << qint64{4096} << qint64{3} << false;
    QTest::newRow("other rank") << allreduce << qint64{2} << qint64{4096} << qint64{3} << false;
    QTest::newRow("too small") << allreduce << qint64{1} << qint64{1023} << qint64{3} << false;
    QTest::newRow("too large") << allreduce << qint64{1} << qint64{1 << 20} << qint64{3} << false;
    QTest::newRow("upper bound inclusive") << allreduce << qint64{1} << qint64{65536} << qint64{3} << true;
    QTest::newRow("other step") << allreduce << qint64{1} << qint64{4096} << qint64{4} << false;
  }
  void filterMatches() {
    QFETCH(int, api);
    QFETCH(qint64, rank);
    QFETCH(qint64, bytes);
    QFETCH(qint64, step);
    QFETCH(bool, matches);
    CallFilter f;
    f.api = gradscope::Api::MpiAllreduce;
    f.rank_id = 1;
    f.min_bytes = 1024;
    f.max_bytes = 65536;
    f.step = 3;
    QCOMPARE(f.matches(static_cast<gradscope::Api>(api), rank, bytes, step), matches);
    QVERIFY(CallFilter{}.matches(static_cast<gradscope::Api>(api), rank, bytes, step));
  }
};

QTEST_APPLESS_MAIN(ViewStateTest)
#include "view_state_test.moc"
