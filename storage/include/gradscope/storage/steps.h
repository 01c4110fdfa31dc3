#pragma once

// Training-step detection from the repeating pattern of a rank's calls, for traces whose calls carry no
// explicit step (step = -1). Explicit markers (the agent writes step >= 0 when the user marks steps)
// are exact and always win: merge only detects steps for ranks whose calls all have step -1.
//
// The rule, applied to the signatures of one rank's calls in call order (a signature hashes one call's
// communicator key, api, dtype, op and count; see callSignature()):
//
//   A stretch with period P starting at position i is the longest run s[i..e) with s[k] == s[k-P] for
//   every k in [i+P, e); it "repeats" when it holds at least min_repeats whole periods (e - i >= R·P).
//   Scanning left to right, at each position i take, among the repeating periods P <= max_period found
//   there, the one whose stretch reaches farthest (ties: the smallest P). Each period of the stretch is
//   one step; a final partial period is one more step. Scanning resumes where the stretch ends. A call
//   at which nothing repeats gets -1. Steps count up across stretches.
//
// So setup calls before the loop get -1 and the loop's first call starts step 0; an evaluation phase in
// the middle gets -1 and the training steps after it continue the numbering; one identical call
// repeated forever is one call per step (P = 1). "Farthest, not smallest" keeps a run of identical
// calls inside a step (DDP buckets of equal size, FSDP's per-layer all-gathers: [A A A B] repeated) from
// being taken for steps of its own: its stretch ends inside the first step, the loop's reaches the end.
//
// Candidate periods, which make the work per call bounded: P is tried only where the call's signature
// recurs at i+P, following the chain of its next occurrences (kMaxCandidates tries per position); after a
// repeating P with stretch end e, the chain skips ahead to occurrences beyond e - P (a longer period
// cannot be shorter than the run it contains). A loop whose period is not among those tries is missed.
//
// Known ambiguity: the phase of the loop is where its pattern first repeats. A setup call identical to
// the loop's last call (or a warm-up that repeats the loop's opening calls) shifts the step boundaries
// by those calls, and an evaluation loop that repeats min_repeats times is counted as steps too. Use
// explicit markers where exact step boundaries matter.
//
// The result is a pure function of the signatures and options: ranks with the same call sequence get the
// same steps.
//
// Cost, for n calls: one pass with a hash map of the distinct signatures, then at most kMaxCandidates
// O(1) checks per position (a window comparison by polynomial hash); a check that passes is confirmed
// and extended call by call, which the stretch then pays for (each stretch is scanned at most
// kMaxCandidates times). Worst case O(kMaxCandidates · n) plus a hash collision's rare re-check, on any
// input. Memory: 12 bytes per call of working state (next-occurrence distance, prefix hash) and a
// hash-map entry per distinct signature, besides the 8-byte result.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "gradscope/common/types.h"

namespace gradscope::storage {

struct StepDetectionOptions {
  std::int64_t max_period = 4096;  // longest step, in calls; values < 1 detect nothing
  int min_repeats = 3;             // whole periods a stretch needs; values < 2 are taken as 2
};

// Candidate periods tried per position (see above).
inline constexpr int kMaxCandidates = 16;

// The step of each call (0, 1, ...) or -1, by the rule above.
std::vector<std::int64_t> detectSteps(std::span<const std::uint64_t> signatures,
                                      const StepDetectionOptions& options = {});

// The signature detectSteps compares: equal calls on different ranks get equal signatures (the
// communicator is named by its key, which is the same on every rank, not by a file-local id).
std::uint64_t callSignature(std::string_view comm_key, Api api, DType dtype, ReduceOp op, std::int64_t count);

}  // namespace gradscope::storage
