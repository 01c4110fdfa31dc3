#pragma once

#include "gradscope/comm/communicator.h"

namespace gradscope::comm {

// The world of the test run: MPI_COMM_WORLD (strategies_test_main.cc) or the NCCL ranks the test
// started (strategies_test_nccl_main.cc).
Communicator& testWorld();

// Rank 0 keeps GoogleTest's report; any other rank prints only its failures, prefixed with its rank
// (strategies_test_world.cc). Call after InitGoogleTest.
void reportAsRank(int rank);

}  // namespace gradscope::comm
