// The Perfetto export in a build without protobuf: every call says which packages bring it.

#include "gradscope/common/error.h"
#include "gradscope/storage/export.h"

namespace gradscope::storage {

bool perfettoExportAvailable() {
  return false;
}

void writePerfettoTrace(const TraceReader&, std::ostream&, const PerfettoOptions&) {
  fail(
      "this gradscope was built without protobuf, which --format perfetto needs: install libprotobuf-dev and "
      "protobuf-compiler (scripts/bootstrap.sh does) and rebuild, or use --format chrome-trace");
}

}  // namespace gradscope::storage
