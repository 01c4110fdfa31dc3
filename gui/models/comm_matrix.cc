#include "models/comm_matrix.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <QBrush>

#include "models/units_text.h"

namespace gradscope::gui {

namespace {

// ColorBrewer "Blues", light to dark (colorbrewer2.org, 9 classes, sequential).
constexpr std::array<QRgb, 9> kBlues = {0xf7fbff, 0xdeebf7, 0xc6dbef, 0x9ecae1, 0x6baed6,
                                        0x4292c6, 0x2171b5, 0x08519c, 0x08306b};
// Where the smallest non-zero value starts on the ramp: a visible tint, never white.
constexpr double kLightest = 0.12;
// Past this point of the ramp the cell is dark enough for white text.
constexpr double kLightTextFrom = 0.6;

double rampPosition(double share) {
  return kLightest + (1 - kLightest) * std::clamp(share, 0.0, 1.0);
}

}  // namespace

QColor matrixColour(double share) {
  if (!(share > 0)) return QColor(0xfa, 0xfb, 0xfc);  // none: a white barely grey, for the grid's cells
  const double position = rampPosition(share) * static_cast<double>(kBlues.size() - 1);
  const auto low = static_cast<std::size_t>(std::floor(position));
  const std::size_t high = std::min(low + 1, kBlues.size() - 1);
  const double f = position - static_cast<double>(low);
  const auto mix = [f](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * f)); };
  const QColor a = QColor::fromRgb(kBlues[low]);
  const QColor b = QColor::fromRgb(kBlues[high]);
  return QColor(mix(a.red(), b.red()), mix(a.green(), b.green()), mix(a.blue(), b.blue()));
}

bool matrixTextIsLight(double share) {
  return share > 0 && rampPosition(share) >= kLightTextFrom;
}

// ---- CommMatrixModel

void CommMatrixModel::setMatrix(storage::PeerMatrix matrix) {
  beginResetModel();
  matrix_ = std::move(matrix);
  const auto cells = static_cast<std::size_t>(matrix_.ranks) * static_cast<std::size_t>(matrix_.ranks);
  // A matrix whose vectors do not hold ranks × ranks values is read as empty rather than out of bounds.
  for (auto* values : {&matrix_.sent_bytes, &matrix_.send_calls, &matrix_.send_ns, &matrix_.recv_ns,
                       &matrix_.recv_calls, &matrix_.calls})
    values->resize(cells, 0);
  largest_ = {0, 0};
  for (int rank = 0; rank < matrix_.ranks; ++rank) {
    for (int peer = 0; peer < matrix_.ranks; ++peer) {
      largest_[0] = std::max(largest_[0], value(rank, peer, MatrixMetric::Bytes));
      largest_[1] = std::max(largest_[1], value(rank, peer, MatrixMetric::Time));
    }
  }
  endResetModel();
}

void CommMatrixModel::setMetric(MatrixMetric metric) {
  if (metric == metric_) return;
  metric_ = metric;
  if (matrix_.ranks > 0) {
    emit dataChanged(index(0, 0), index(matrix_.ranks - 1, matrix_.ranks - 1));
  }
}

double CommMatrixModel::value(int rank, int peer, MatrixMetric metric) const {
  if (rank < 0 || peer < 0 || rank >= matrix_.ranks || peer >= matrix_.ranks) return 0;
  const std::size_t i = at(rank, peer);
  return metric == MatrixMetric::Bytes ? static_cast<double>(matrix_.sent_bytes[i])
                                       : static_cast<double>(matrix_.send_ns[i] + matrix_.recv_ns[i]);
}

double CommMatrixModel::value(int rank, int peer) const {
  return value(rank, peer, metric_);
}

double CommMatrixModel::maxValue() const {
  return largest_[metric_ == MatrixMetric::Bytes ? 0 : 1];
}

bool CommMatrixModel::empty() const {
  return std::all_of(matrix_.calls.begin(), matrix_.calls.end(), [](std::int64_t n) { return n == 0; });
}

QString CommMatrixModel::valueText(double value) const {
  if (!(value > 0)) return {};
  return metric_ == MatrixMetric::Bytes ? bytesText(std::llround(value))
                                        : durationText(static_cast<std::int64_t>(std::llround(value)));
}

int CommMatrixModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : matrix_.ranks;
}

int CommMatrixModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : matrix_.ranks;
}

QVariant CommMatrixModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const int rank = index.row();
  const int peer = index.column();
  const double v = value(rank, peer);
  const double largest = maxValue();
  const double share = largest > 0 ? v / largest : 0;
  switch (role) {
    case Qt::DisplayRole: return valueText(v);
    case kValueRole: return v;
    case Qt::BackgroundRole: return QBrush(matrixColour(share));
    case Qt::ForegroundRole:
      return QBrush(matrixTextIsLight(share) ? QColor(Qt::white) : QColor(0x22, 0x26, 0x2e));
    case Qt::TextAlignmentRole: return QVariant::fromValue(Qt::Alignment(Qt::AlignCenter));
    case Qt::ToolTipRole: {
      const std::size_t i = at(rank, peer);
      const std::size_t back = at(peer, rank);  // what the peer sent this rank
      const auto count = [](std::int64_t n, const char* what) {
        return QStringLiteral("%1 %2%3")
            .arg(
                QString::fromStdString(formatCount(static_cast<std::uint64_t>(std::max<std::int64_t>(n, 0)))))
            .arg(QLatin1String(what))
            .arg(n == 1 ? QString() : QStringLiteral("s"));
      };
      return QStringLiteral(
                 "<b>rank %1 ↔ peer %2</b><br>sent %3 in %4 (%5)<br>received %6 in %7 (%8)<br>%9 in all")
          .arg(rank)
          .arg(peer)
          .arg(bytesText(matrix_.sent_bytes[i]), count(matrix_.send_calls[i], "send"),
               durationText(matrix_.send_ns[i]), bytesText(matrix_.sent_bytes[back]),
               count(matrix_.recv_calls[i], "receive"), durationText(matrix_.recv_ns[i]),
               count(matrix_.calls[i], "point-to-point call"));
    }
    default: return {};
  }
}

QVariant CommMatrixModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (role != Qt::DisplayRole || section < 0 || section >= matrix_.ranks) return {};
  return orientation == Qt::Vertical ? QStringLiteral("rank %1").arg(section)
                                     : QStringLiteral("peer %1").arg(section);
}

// ---- the scene

namespace {

// Room for the row labels (the widest rank number) and the scale's labels.
int rowLabelWidth(int ranks, const TextMetrics& text) {
  return std::max(text.width(QStringLiteral("rank")), text.width(QString::number(std::max(0, ranks - 1)))) +
         4;
}

QRect gridOrigin(int ranks, const TextMetrics& text) {
  const int left = kMatrixMargin + rowLabelWidth(ranks, text) + 6;
  const int top = kMatrixMargin + 2 * text.height + 6;  // the column title, then the column labels
  return {left, top, 0, 0};
}

int scaleAreaWidth(const TextMetrics& text) {
  return 16 + kMatrixScaleWidth + 6 + text.width(QStringLiteral("999 MiB")) + kMatrixMargin;
}

}  // namespace

QSize commMatrixMinimumSize(int ranks, const TextMetrics& text) {
  const QRect origin = gridOrigin(ranks, text);
  const int cell = ranks <= kMatrixMaxTextRanks ? kMatrixMinCell : 1;
  const int side = cell * std::max(ranks, 1);
  return {origin.left() + side + scaleAreaWidth(text), origin.top() + side + kMatrixMargin};
}

CommMatrixScene buildCommMatrixScene(const CommMatrixModel& model, QSize size, const TextMetrics& text) {
  CommMatrixScene scene;
  scene.size = size;
  scene.ranks = model.ranks();
  if (model.empty()) {
    scene.message =
        SceneText{QRect(kMatrixMargin, kMatrixMargin, size.width() - 2 * kMatrixMargin, 3 * text.height),
                  scene.ranks == 0 ? QStringLiteral("No point-to-point calls to show.")
                                   : QStringLiteral("This trace has no point-to-point calls: "
                                                    "its ranks exchanged data in collectives only."),
                  false};
    return scene;
  }
  const int n = scene.ranks;
  const QRect origin = gridOrigin(n, text);
  const int available = std::min(size.width() - origin.left() - scaleAreaWidth(text),
                                 size.height() - origin.top() - kMatrixMargin);
  scene.cell = std::clamp(available / n, n <= kMatrixMaxTextRanks ? kMatrixMinCell : 1, kMatrixMaxCell);
  scene.grid = QRect(origin.left(), origin.top(), scene.cell * n, scene.cell * n);

  // Labels every 1, 2, 4, ... ranks: as often as a label's height (rows) and width (columns) allow, with
  // room between neighbours.
  const int label_width = text.width(QString::number(n - 1)) + 10;
  while (scene.label_step * scene.cell < std::max(text.height, label_width) && scene.label_step < n)
    scene.label_step *= 2;
  const int row_label_width = rowLabelWidth(n, text);
  for (int r = 0; r < n; r += scene.label_step) {
    const int middle = scene.grid.top() + r * scene.cell + scene.cell / 2;
    scene.row_labels.push_back(
        SceneText{QRect(kMatrixMargin, middle - text.height / 2, row_label_width, text.height),
                  QString::number(r), true});
    const QString label = QString::number(r);
    const int width = text.width(label) + 2;
    const int centre = scene.grid.left() + r * scene.cell + scene.cell / 2;
    scene.column_labels.push_back(SceneText{
        QRect(centre - width / 2, scene.grid.top() - text.height - 2, width, text.height), label, false});
  }
  scene.row_title =
      SceneText{QRect(kMatrixMargin, scene.grid.top() - text.height - 2, row_label_width, text.height),
                QStringLiteral("rank"), true};
  scene.column_title = SceneText{
      QRect(scene.grid.left(), kMatrixMargin, std::max(1, size.width() - scene.grid.left() - kMatrixMargin),
            text.height),
      model.metric() == MatrixMetric::Bytes
          ? QStringLiteral("peer →   (a cell: bytes the row's rank sent to the peer)")
          : QStringLiteral(
                "peer →   (a cell: time the row's rank spent sending to the peer plus receiving from it)"),
      false};

  const double largest = model.maxValue();
  const int gap = scene.cell >= 6 ? 1 : 0;
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      const double v = model.value(r, p);
      if (!(v > 0)) continue;
      const double share = v / largest;
      MatrixCell cell;
      cell.rank = r;
      cell.peer = p;
      cell.rect = QRect(scene.grid.left() + p * scene.cell, scene.grid.top() + r * scene.cell,
                        scene.cell - gap, scene.cell - gap);
      cell.colour = matrixColour(share).rgb();
      cell.light_text = matrixTextIsLight(share);
      if (n <= kMatrixMaxTextRanks) {
        const QString value = model.valueText(v);
        const int width = text.width(value);
        if (width + 6 <= cell.rect.width() && text.height + 2 <= cell.rect.height()) {
          const QPoint centre = cell.rect.center();
          cell.text = SceneText{
              QRect(centre.x() - width / 2, centre.y() - text.height / 2 + 1, width + 2, text.height), value,
              false};
        }
      }
      scene.cells.push_back(std::move(cell));
    }
  }

  // The scale: the ramp from the largest value (top) down to the lightest tint, then a white swatch for
  // cells without traffic.
  const int scale_height = std::max(std::min(scene.grid.height() - text.height - 10, 240), 3 * text.height);
  scene.scale = QRect(scene.grid.right() + 17, scene.grid.top(), kMatrixScaleWidth, scale_height);
  scene.none_swatch =
      QRect(scene.scale.left(), scene.scale.bottom() + 10, kMatrixScaleWidth, kMatrixScaleWidth);
  const int label_left = scene.scale.right() + 7;
  const int scale_label_width = std::max(1, size.width() - label_left - 4);
  const auto scale_label = [&](const QString& label, int y) {
    scene.scale_labels.push_back(
        SceneText{QRect(label_left, y - text.height / 2, scale_label_width, text.height), label, false});
  };
  scale_label(model.valueText(largest), scene.scale.top() + text.height / 2);
  scale_label(model.valueText(largest / 2), scene.scale.top() + scene.scale.height() / 2);
  scale_label(QStringLiteral("none"), scene.none_swatch.center().y());
  return scene;
}

std::optional<std::pair<int, int>> CommMatrixScene::cellAt(QPoint point) const {
  if (cell <= 0 || !grid.contains(point)) return std::nullopt;
  return std::pair{(point.y() - grid.top()) / cell, (point.x() - grid.left()) / cell};
}

}  // namespace gradscope::gui
