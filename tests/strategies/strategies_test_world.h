#pragma once

#include "gradscope/comm/communicator.h"

namespace gradscope::comm {

// MPI_COMM_WORLD of the test run (strategies_test_main.cc).
Communicator& testWorld();

}  // namespace gradscope::comm
