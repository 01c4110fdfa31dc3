// Activates the agent's recorder the way an interposer does, in a process that tests/agent/CMakeLists.txt
// makes setuid (agent.secure.setuid): the agent must stay off there. Prints "recording" or "off";
// exits 0 when off.

#include <cstdio>

#include "core/recorder.h"

// LeakSanitizer checks leaks by ptrace-attaching to the process, which a setuid process forbids (and it
// cannot read its environment for options either): in the ASan build it would fail the probe at exit.
extern "C" int __lsan_is_turned_off() {
  return 1;
}

int main() {
  gradscope::agent::Activation activation;
  activation.backend = gradscope::Backend::Mpi;
  const bool recording = gradscope::agent::activate(activation);
  std::printf("%s\n", recording ? "recording" : "off");
  gradscope::agent::finish();
  return recording ? 1 : 0;
}
