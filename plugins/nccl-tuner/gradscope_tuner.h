#pragma once

// Extension functions of libnccl-tuner-gradscope.so beyond NCCL's tuner interface, for the gradscope agent
// (or a test) in the same process. Plain C so that a caller finds them with
// dlsym(RTLD_DEFAULT, "gradscope_tuner_explore_v1") once NCCL has loaded the plugin (NCCL dlopens it with
// RTLD_LOCAL, so a caller may also dlopen the same path with RTLD_NOLOAD and dlsym the handle). The
// _v1 suffix is the interface version: a changed signature gets a new name, the old one stays.
//
// Thread safety: both functions may be called from any thread at any time, also while NCCL calls
// getCollInfo; they take the plugin's registry lock, never held by getCollInfo.
//
// Communicators are named by the commId NCCL passes to the v5 init (equal on every rank of a
// communicator). Contexts created through the v4/v3 interfaces have no id and are registered as 0;
// commId 0 in gradscope_tuner_explore_v1 means every live context.

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Explore mode for the communicator's context(s): repeats >= 1 switches it on, 0 off. While on, every
// getCollInfo call of the context ignores the rules and picks, per (collective, size bucket = bit width of
// nBytes), the (k / repeats)-th usable (algorithm, protocol) in algorithm-major order, modulo their count,
// where k counts this context's earlier calls in the bucket since the switch, and usable means the entry
// NCCL passed is >= 0. Switching resets the counts. The choice depends only on the call order, the sizes
// and the cost table's usable set, which NCCL derives from communicator-wide information, so every rank
// that switches at the same point of its collective sequence makes the same choices in the same calls.
// Returns the number of contexts switched (0: none with that id), or -1 if repeats is negative.
int gradscope_tuner_explore_v1(uint64_t commId, int repeats);
typedef int (*gradscope_tuner_explore_v1_t)(uint64_t commId, int repeats);

// What the last getCollInfo call of the communicator's context for collType (ncclFunc_t value 0..4) asked
// NCCL for: *algorithm and *protocol (NCCL_ALGO_*, NCCL_PROTO_*), or -1 and -1 when it left NCCL's choice;
// *calls is how many getCollInfo calls the context has had for collType. Any pointer may be null.
// Returns 1 when a choice was made, 0 when the last call made none (or there was no call), -1 when no
// live context has that id or collType is out of range. With several contexts of one id (v4 contexts,
// id 0) it reports the oldest.
int gradscope_tuner_last_choice_v1(uint64_t commId, int collType, int* algorithm, int* protocol,
                                   uint64_t* calls);
typedef int (*gradscope_tuner_last_choice_v1_t)(uint64_t commId, int collType, int* algorithm, int* protocol,
                                                uint64_t* calls);

#ifdef __cplusplus
}
#endif
