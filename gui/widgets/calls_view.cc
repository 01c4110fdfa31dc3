#include "widgets/calls_view.h"

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QSignalBlocker>
#include <QTableView>
#include <QTimer>
#include <QVBoxLayout>

#include "gradscope/common/error.h"
#include "gradscope/common/units.h"
#include "models/analysis_models.h"

namespace gradscope::gui {

namespace {
std::optional<std::int64_t> parseSize(const QString& text) {
  if (text.trimmed().isEmpty()) return std::nullopt;
  try {
    return static_cast<std::int64_t>(parseBytes(text.trimmed().toStdString()));
  } catch (const Error&) {
    return std::nullopt;
  }
}
}  // namespace

CallsView::CallsView(ViewState* state, QWidget* parent)
    : QWidget(parent), state_(state), model_(new CallsModel(this)), table_(new QTableView(this)) {
  auto* bar = new QHBoxLayout;
  api_ = new QComboBox(this);
  api_->addItem(QStringLiteral("all APIs"), -1);
  for (const Api api : allApis()) {
    if (api != Api::Unknown) api_->addItem(toQString(name(api)), static_cast<int>(api));
  }
  rank_ = new QComboBox(this);
  rank_->addItem(QStringLiteral("all ranks"), QVariant::fromValue<qint64>(-1));
  min_size_ = new QLineEdit(this);
  min_size_->setPlaceholderText(QStringLiteral("min size, e.g. 64K"));
  max_size_ = new QLineEdit(this);
  max_size_->setPlaceholderText(QStringLiteral("max size, e.g. 4M"));
  step_ = new QLineEdit(this);
  step_->setPlaceholderText(QStringLiteral("step"));
  step_->setMaximumWidth(90);
  window_only_ = new QCheckBox(QStringLiteral("visible window only"), this);
  window_only_->setChecked(true);
  count_ = new QLabel(this);
  count_->setMinimumWidth(220);
  bar->addWidget(new QLabel(QStringLiteral("Filter:"), this));
  bar->addWidget(api_);
  bar->addWidget(rank_);
  bar->addWidget(min_size_);
  bar->addWidget(max_size_);
  bar->addWidget(step_);
  bar->addWidget(window_only_);
  bar->addStretch(1);
  bar->addWidget(count_);

  table_->setModel(model_);
  table_->setSortingEnabled(true);
  table_->sortByColumn(static_cast<int>(CallColumn::Id), Qt::AscendingOrder);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->setAlternatingRowColors(true);
  table_->verticalHeader()->hide();
  table_->verticalHeader()->setDefaultSectionSize(table_->fontMetrics().height() + 6);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Interactive);
  const int digit = table_->fontMetrics().horizontalAdvance(QLatin1Char('0'));
  const int widths[] = {10, 6, 14, 7, 20, 10, 14, 11, 8, 8, 7, 14};
  for (int column = 0; column < static_cast<int>(CallColumn::Count); ++column) {
    table_->setColumnWidth(column, widths[column] * digit + 16);
  }

  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addLayout(bar);
  layout->addWidget(table_, 1);

  connect(api_, &QComboBox::currentIndexChanged, this, &CallsView::applyFilter);
  connect(rank_, &QComboBox::currentIndexChanged, this, &CallsView::applyFilter);
  connect(min_size_, &QLineEdit::editingFinished, this, &CallsView::applyFilter);
  connect(max_size_, &QLineEdit::editingFinished, this, &CallsView::applyFilter);
  connect(step_, &QLineEdit::editingFinished, this, &CallsView::applyFilter);
  connect(window_only_, &QCheckBox::toggled, this, &CallsView::applyFilter);
  connect(state_, &ViewState::filterChanged, this, [this] {
    // Set elsewhere (the Steps view picks a rank): the bar shows what is in force.
    {
      const QSignalBlocker block(rank_);
      const int index = rank_->findData(QVariant::fromValue<qint64>(state_->filter().rank_id.value_or(-1)));
      if (index >= 0) rank_->setCurrentIndex(index);
    }
    CallsQuery query = model_->query();
    query.filter = state_->filter();
    query.window =
        query.filter.visible_window_only ? std::optional<TimeRange>(state_->window()) : std::nullopt;
    model_->setQuery(query);
  });
  // The window changes continuously while the user drags: requery once it settles.
  settle_ = new QTimer(this);
  auto* settle = settle_;
  settle->setSingleShot(true);
  settle->setInterval(150);
  connect(settle, &QTimer::timeout, this, [this] {
    if (!state_->filter().visible_window_only) return;
    CallsQuery query = model_->query();
    query.window = state_->window();
    model_->setQuery(query);
  });
  connect(state_, &ViewState::windowChanged, settle, qOverload<>(&QTimer::start));
  connect(model_, &CallsModel::matchingCallsChanged, this, &CallsView::updateCount);
  connect(model_, &CallsModel::pageLoaded, this, [this] {
    updateCount();
    syncSelection();
  });
  connect(model_, &CallsModel::failed, this, [this](const QString& message) { count_->setText(message); });
  connect(state_, &ViewState::selectionChanged, this, &CallsView::syncSelection);
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) {
            if (syncing_ || !current.isValid()) return;
            if (const CallRow* row = model_->rowAt(current.row())) {
              state_->setSelection(
                  SelectedCall{row->call.id, row->call.rank_id, row->call.start_ns, row->call.end_ns});
            }
          });
}

void CallsView::setTrace(const TraceInfo& info) {
  {
    const QSignalBlocker block(rank_);
    rank_->clear();
    rank_->addItem(QStringLiteral("all ranks"), QVariant::fromValue<qint64>(-1));
    for (const storage::RankInfo& rank : info.ranks) {
      rank_->addItem(QStringLiteral("rank %1 (%2)").arg(rank.rank).arg(QString::fromStdString(rank.host)),
                     QVariant::fromValue<qint64>(rank.id));
    }
  }
  model_->setTrace(info.path, info.ranks);
  CallsQuery query = model_->query();
  query.filter = state_->filter();
  query.window = query.filter.visible_window_only ? std::optional<TimeRange>(state_->window()) : std::nullopt;
  model_->setQuery(query);
}

void CallsView::clear() {
  model_->clear();
}

bool CallsView::requeryPending() const {
  return settle_->isActive();
}

void CallsView::applyFilter() {
  CallFilter filter;
  const int api = api_->currentData().toInt();
  if (api >= 0) filter.api = static_cast<Api>(api);
  const qint64 rank = rank_->currentData().toLongLong();
  if (rank >= 0) filter.rank_id = rank;
  filter.min_bytes = parseSize(min_size_->text()).value_or(0);
  filter.max_bytes = parseSize(max_size_->text());
  bool ok = false;
  const qint64 step = step_->text().trimmed().toLongLong(&ok);
  if (ok) filter.step = step;
  filter.visible_window_only = window_only_->isChecked();
  state_->setFilter(filter);
}

void CallsView::updateCount() {
  const QString loaded = QString::fromStdString(formatCount(static_cast<std::uint64_t>(model_->rowCount())));
  if (const std::optional<std::int64_t> matching = model_->matchingCalls()) {
    count_->setText(
        QStringLiteral("%1 matching calls (%2 loaded)")
            .arg(QString::fromStdString(formatCount(static_cast<std::uint64_t>(*matching))), loaded));
  } else {
    count_->setText(QStringLiteral("%1 loaded, counting…").arg(loaded));
  }
}

void CallsView::syncSelection() {
  const std::optional<SelectedCall> selection = state_->selection();
  if (!selection) return;
  const int row = model_->rowOfCall(selection->id);
  if (row < 0) return;
  syncing_ = true;
  const QModelIndex index = model_->index(row, 0);
  table_->selectionModel()->setCurrentIndex(index,
                                            QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
  table_->scrollTo(index);
  syncing_ = false;
}

}  // namespace gradscope::gui
