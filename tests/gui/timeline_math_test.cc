// The timeline's time↔pixel math, zoom, pan and axis ticks (gui/models/timeline_math.h).

#include "models/timeline_math.h"

#include <cmath>

#include <QTest>

using gradscope::gui::TimelineMath;
using gradscope::gui::TimeRange;

class TimelineMathTest : public QObject {
  Q_OBJECT
 private slots:
  void mapsBothWays_data() {
    QTest::addColumn<double>("t");
    QTest::addColumn<double>("x");
    // window [1000, 2000) ns onto 100 px starting at x = 50
    QTest::newRow("begin") << 1000.0 << 50.0;
    QTest::newRow("middle") << 1500.0 << 100.0;
    QTest::newRow("end") << 2000.0 << 150.0;
    QTest::newRow("before") << 0.0 << -50.0;
  }
  void mapsBothWays() {
    QFETCH(double, t);
    QFETCH(double, x);
    const TimelineMath m{TimeRange{1000, 2000}, 50, 100};
    QCOMPARE(m.timeToX(t), x);
    QCOMPARE(m.xToTime(x), t);
    QCOMPARE(m.nsPerPixel(), 10.0);
  }

  void columnIsClamped() {
    const TimelineMath m{TimeRange{0, 1000}, 10, 100};
    QCOMPARE(m.columnOf(0), 10);
    QCOMPARE(m.columnOf(15), 11);
    QCOMPARE(m.columnOf(-500), 10);
    QCOMPARE(m.columnOf(5000), 109);
  }

  void zoomKeepsTheAnchorInPlace_data() {
    QTest::addColumn<double>("anchor");
    QTest::addColumn<double>("factor");
    QTest::newRow("in at a quarter") << 3.5e6 << 0.5;
    QTest::newRow("out at the middle") << 5e6 << 1.5;
    QTest::newRow("in at the left edge") << 2e6 << 0.1;
  }
  void zoomKeepsTheAnchorInPlace() {
    QFETCH(double, anchor);
    QFETCH(double, factor);
    const TimeRange extent{0, 1e8};
    const TimeRange window{2e6, 8e6};
    const TimeRange zoomed = gradscope::gui::zoomAround(window, anchor, factor, extent);
    QCOMPARE(zoomed.length(), window.length() * factor);
    const double share_before = (anchor - window.begin_ns) / window.length();
    const double share_after = (anchor - zoomed.begin_ns) / zoomed.length();
    QVERIFY(std::abs(share_before - share_after) < 1e-12);
  }

  void zoomStaysInsideTheExtent() {
    const TimeRange extent{0, 1000000};
    // Zooming out past the extent gives the extent; near an edge the window shifts inside.
    QCOMPARE(gradscope::gui::zoomAround({100000, 900000}, 500000, 4, extent), extent);
    const TimeRange near_edge = gradscope::gui::zoomAround({0, 100000}, 0, 2, extent);
    QCOMPARE(near_edge, (TimeRange{0, 200000}));
    // No window narrower than the minimum.
    const TimeRange tiny = gradscope::gui::zoomAround({500000, 502000}, 501000, 1e-6, extent);
    QCOMPARE(tiny.length(), gradscope::gui::kMinWindowNs);
    QVERIFY(tiny.contains(501000));
  }

  void panIsClamped() {
    const TimeRange extent{0, 1000};
    QCOMPARE(gradscope::gui::panBy({100, 200}, 50, extent), (TimeRange{150, 250}));
    QCOMPARE(gradscope::gui::panBy({100, 200}, -500, extent), (TimeRange{0, 100}));
    QCOMPARE(gradscope::gui::panBy({100, 200}, 5000, extent), (TimeRange{900, 1000}));
    // An empty extent (a trace without calls) leaves the window alone.
    QCOMPARE(gradscope::gui::panBy({100, 200}, 5, TimeRange{}), (TimeRange{105, 205}));
  }

  void niceSteps_data() {
    QTest::addColumn<double>("range");
    QTest::addColumn<int>("ticks");
    QTest::addColumn<double>("step");
    QTest::newRow("1 s in 10") << 1e9 << 10 << 1e8;
    QTest::newRow("1 s in 4") << 1e9 << 4 << 5e8;
    QTest::newRow("7 ms in 10") << 7e6 << 10 << 1e6;
    QTest::newRow("3 µs in 10") << 3e3 << 10 << 500.0;
    QTest::newRow("13 s in 12") << 13e9 << 12 << 2e9;
    QTest::newRow("never below 1 ns") << 3.0 << 10 << 1.0;
  }
  void niceSteps() {
    QFETCH(double, range);
    QFETCH(int, ticks);
    QFETCH(double, step);
    QCOMPARE(gradscope::gui::niceStep(range, ticks), step);
  }

  void ticksAreMultiplesInsideTheWindow() {
    const gradscope::gui::AxisTicks ticks = gradscope::gui::axisTicks({1.23e9, 2.51e9}, 8);
    QCOMPARE(ticks.step_ns, 2e8);
    QCOMPARE(ticks.ticks_ns.front(), 1.4e9);
    QCOMPARE(ticks.ticks_ns.back(), 2.4e9);
    QCOMPARE(ticks.ticks_ns.size(), std::size_t{6});
    QVERIFY(gradscope::gui::axisTicks(TimeRange{}, 8).ticks_ns.empty());
  }

  void tickLabels_data() {
    QTest::addColumn<double>("t");
    QTest::addColumn<double>("step");
    QTest::addColumn<QString>("label");
    QTest::newRow("seconds") << 2e9 << 5e8 << QStringLiteral("2.0 s");
    QTest::newRow("ms step in seconds") << 1.52e9 << 2e7 << QStringLiteral("1.52 s");
    QTest::newRow("µs step") << 1.5e6 << 5e5 << QStringLiteral("1.5 ms");
    QTest::newRow("fine µs") << 12500.0 << 500.0 << QStringLiteral("12.5 µs");
    QTest::newRow("ns") << 800.0 << 100.0 << QStringLiteral("0.8 µs");
    QTest::newRow("zero") << 0.0 << 1e9 << QStringLiteral("0 s");
  }
  void tickLabels() {
    QFETCH(double, t);
    QFETCH(double, step);
    QFETCH(QString, label);
    QCOMPARE(QString::fromStdString(gradscope::gui::tickLabel(t, step)), label);
  }

  void niceValueAxes_data() {
    QTest::addColumn<double>("lo");
    QTest::addColumn<double>("hi");
    QTest::addColumn<int>("max_ticks");
    QTest::addColumn<double>("min");
    QTest::addColumn<double>("max");
    QTest::addColumn<int>("ticks");
    QTest::addColumn<int>("decimals");
    // The bus bandwidth chart: from 0, not 0.00, 0.88, 1.76…
    QTest::newRow("bandwidth") << 0.0 << 3.19 << 8 << 0.0 << 3.5 << 8 << 1;
    // α: non-negative data is not padded below 0.
    QTest::newRow("alpha") << 0.0004 << 0.0359 << 8 << 0.0 << 0.04 << 5 << 2;
    QTest::newRow("cosine") << 0.32 << 0.86 << 8 << 0.2 << 0.9 << 8 << 1;
    QTest::newRow("negative") << -3.0 << 7.0 << 6 << -5.0 << 10.0 << 4 << 0;
    QTest::newRow("one value") << 2.0 << 2.0 << 8 << 1.8 << 2.2 << 5 << 1;
  }
  void niceValueAxes() {
    QFETCH(double, lo);
    QFETCH(double, hi);
    QFETCH(int, max_ticks);
    const gradscope::gui::ValueAxisTicks axis = gradscope::gui::niceValueAxis(lo, hi, max_ticks);
    QTEST(axis.min, "min");
    QTEST(axis.max, "max");
    QTEST(axis.ticks, "ticks");
    QTEST(axis.decimals, "decimals");
    QVERIFY(axis.ticks <= max_ticks);
  }

  void niceLogAxes_data() {
    QTest::addColumn<double>("lo");
    QTest::addColumn<double>("hi");
    QTest::addColumn<int>("max_ticks");
    QTest::addColumn<QVector<double>>("ticks");
    // A narrow range still gets several labels, and its ends are labelled.
    QTest::newRow("7 to 40") << 7.0 << 40.0 << 7 << QVector<double>{5, 10, 20, 50};
    QTest::newRow("1-3") << 30.0 << 42000.0 << 8 << QVector<double>{30, 100, 300, 1e3, 3e3, 1e4, 3e4, 1e5};
    QTest::newRow("decades") << 3e-10 << 0.3 << 12 << QVector<double>{1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5,
                                                                      1e-4,  1e-3, 1e-2, 1e-1, 1};
    QTest::newRow("every 2nd decade")
        << 3e-10 << 0.3 << 7 << QVector<double>{1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 1};
    QTest::newRow("on a tick") << 1.0 << 100.0 << 8 << QVector<double>{1, 2, 5, 10, 20, 50, 100};
  }
  void niceLogAxes() {
    QFETCH(double, lo);
    QFETCH(double, hi);
    QFETCH(int, max_ticks);
    QFETCH(QVector<double>, ticks);
    const gradscope::gui::LogAxisTicks axis = gradscope::gui::niceLogAxis(lo, hi, max_ticks);
    QCOMPARE(axis.ticks.size(), static_cast<std::size_t>(ticks.size()));
    for (qsizetype i = 0; i < ticks.size(); ++i) {
      QVERIFY2(std::abs(axis.ticks[static_cast<std::size_t>(i)] / ticks[i] - 1) < 1e-9,
               qPrintable(QString::number(i)));
    }
    QCOMPARE(axis.min, axis.ticks.front());
    QCOMPARE(axis.max, axis.ticks.back());
    QVERIFY(axis.min <= lo && axis.max >= hi);
  }

  void logTickLabels() {
    using gradscope::gui::LogLabels;
    using gradscope::gui::logTickLabel;
    QCOMPARE(logTickLabel(0.5, LogLabels::Plain), std::string("0.5"));
    QCOMPARE(logTickLabel(20, LogLabels::Plain), std::string("20"));
    QCOMPARE(logTickLabel(2e-5, LogLabels::Plain), std::string("2e-5"));
    QCOMPARE(logTickLabel(1e6, LogLabels::Plain), std::string("1e6"));
    QCOMPARE(logTickLabel(300, LogLabels::Si), std::string("300"));
    QCOMPARE(logTickLabel(3e4, LogLabels::Si), std::string("30k"));
    QCOMPARE(logTickLabel(1e6, LogLabels::Si), std::string("1M"));
    QCOMPARE(logTickLabel(1, LogLabels::Scientific), std::string("1"));
    QCOMPARE(logTickLabel(0.1, LogLabels::Scientific), std::string("1e-1"));
    QCOMPARE(logTickLabel(1e-9, LogLabels::Scientific), std::string("1e-9"));
    QCOMPARE(logTickLabel(5e3, LogLabels::Scientific), std::string("5e3"));
  }
};

QTEST_APPLESS_MAIN(TimelineMathTest)
#include "timeline_math_test.moc"
