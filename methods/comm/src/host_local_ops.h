#pragma once

// LocalOps on host memory: the methods library's CPU kernels on the shared CpuExecutor. Used by the
// MPI communicator (and by anything else whose buffers live on the host).

#include <memory>

#include "gradscope/comm/communicator.h"

namespace gradscope::comm {

std::unique_ptr<LocalOps> makeHostLocalOps();

}  // namespace gradscope::comm
