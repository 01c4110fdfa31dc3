// Uses an installed gradscope the way an outside project would: only public headers, only exported
// targets. check_install.sh compares its output with what it expects.

#include <cstdlib>
#include <iostream>

#include "gradscope/common/units.h"
#include "gradscope/common/version.h"

#ifdef GRADSCOPE_CONSUMER_WITH_STORAGE
#include "gradscope/storage/export.h"
#include "gradscope/storage/schema.h"
#endif

int main() {
  std::cout << "gradscope version: " << gradscope::kVersion << "\n";
  std::cout << "formatBytes(1536): " << gradscope::formatBytes(1536) << "\n";
#ifdef GRADSCOPE_CONSUMER_WITH_STORAGE
  // A non-inline function, so the storage library itself is linked, not only its headers read.
  std::cout << "storage schema v" << gradscope::storage::kSchemaVersion << " with "
            << gradscope::storage::tableNames().size() << " tables\n";
  // Links the Perfetto exporter, and with it protobuf where the build has it (find_dependency(Protobuf)).
  std::cout << "perfetto export: " << (gradscope::storage::perfettoExportAvailable() ? "yes" : "no") << "\n";
#endif
  return EXIT_SUCCESS;
}
