#pragma once

// Finding the library's own definitions of what the agent interposes.
//
// The agent links neither MPI nor NCCL (it is preloaded into shells and launchers too), so it looks
// the real functions up at run time: first with RTLD_NEXT (the library is linked by the program or a
// library it loads globally), then in every loaded object (mpi4py and PyTorch load libmpi and libnccl
// with RTLD_LOCAL, which RTLD_NEXT does not search). Results are cached by the callers.

namespace gradscope::agent {

// The address of `name` in a library loaded in this process other than the agent, or nullptr.
void* findNextSymbol(const char* name);

// The address of the data object `name` as the program uses it. Unlike functions, data must be
// looked up from the start of the search order: an executable that refers to a library's object
// (Open MPI's predefined handles, for instance) holds a copy of it (a copy relocation) that the
// library itself uses, and RTLD_NEXT would skip that copy.
void* findDataSymbol(const char* name);

}  // namespace gradscope::agent
