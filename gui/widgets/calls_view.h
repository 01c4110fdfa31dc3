#pragma once

// The calls table under the timeline: a filter bar (API, rank, size range, step, visible window only)
// over CallsModel, whose pages load as the user scrolls. Selecting a row selects the call in the shared
// ViewState (the timeline outlines it and brings it into view); a call selected on the timeline is
// selected here when its row is loaded.

#include <QWidget>

#include "models/calls_model.h"
#include "models/trace_data.h"
#include "models/view_state.h"

class QComboBox;
class QLabel;
class QLineEdit;
class QCheckBox;
class QTableView;
class QTimer;

namespace gradscope::gui {

class CallsView : public QWidget {
  Q_OBJECT
 public:
  CallsView(ViewState* state, QWidget* parent = nullptr);
  void setTrace(const TraceInfo& info);
  void clear();
  CallsModel* model() { return model_; }
  QTableView* table() { return table_; }
  // The window moved and the table will follow it once the window settles.
  bool requeryPending() const;

 private:
  void applyFilter();
  void syncSelection();
  void updateCount();

  ViewState* state_;
  CallsModel* model_;
  QTableView* table_;
  QComboBox* api_;
  QComboBox* rank_;
  QLineEdit* min_size_;
  QLineEdit* max_size_;
  QLineEdit* step_;
  QCheckBox* window_only_;
  QLabel* count_;
  QTimer* settle_;
  bool syncing_ = false;
};

}  // namespace gradscope::gui
