// The agent as an NVTX injection library, for the explicit step marker GRADSCOPE_STEP_NVTX=<range> and the
// names of the GPU windows' kernels (the job's ranges; agent/core/cupti_tracer.h).
//
// NVTX v3 is header-only: the first NVTX call in a process loads the library named by
// NVTX_INJECTION64_PATH and calls its InitializeInjectionNvtx2. `gradscope run` points that variable at
// the agent when GRADSCOPE_STEP_NVTX is given; the library is then the agent already preloaded (the
// dynamic loader recognises the same file), so the hooks below reach the recorder's state.
//
// The agent hooks the range pushes (ASCII, wide and attribute forms, global and domain): a push of the
// configured name starts a step; and the pops, so that the GPU windows know each thread's innermost range.
// It does not count levels for NVTX, so pushes and pops return NVTX_NO_PUSH_POP_TRACKING. Messages given
// as registered string handles are not resolved (their pushes neither start steps nor name kernels).
// Every NVTX function the agent leaves alone stays a no-op, as without a tool.

#include <cstdint>
#include <cwchar>

#include "core/recorder.h"
#include "interpose/nvtx_abi.h"

namespace gradscope::agent {
namespace {

// A wide message in ASCII (in `buffer`), or nullptr when it has other characters or is longer than
// the buffer: such a name cannot be the configured one.
const char* asciiOf(const wchar_t* message, char (&buffer)[256]) {
  if (message == nullptr) return nullptr;
  std::size_t i = 0;
  for (; message[i] != L'\0'; ++i) {
    if (i + 1 == sizeof buffer || message[i] < 0 || message[i] > 0x7f) return nullptr;
    buffer[i] = static_cast<char>(message[i]);
  }
  buffer[i] = '\0';
  return buffer;
}

void pushedWide(const wchar_t* message) {
  char buffer[256];
  const char* ascii = asciiOf(message, buffer);
  nvtxRangePushed(ascii);  // (nullptr: a range all the same, without a name)
}

void pushedAttributes(const nvtx::EventAttributes* attributes) {
  if (attributes != nullptr && attributes->messageType == nvtx::kMessageAscii)
    nvtxRangePushed(attributes->message.ascii);
  else if (attributes != nullptr && attributes->messageType == nvtx::kMessageUnicode)
    pushedWide(attributes->message.unicode);
  else nvtxRangePushed(nullptr);  // a range all the same: its pop comes
}

int rangePushA(const char* message) {
  nvtxRangePushed(message);
  return nvtx::kNoPushPopTracking;
}

int rangePushW(const wchar_t* message) {
  pushedWide(message);
  return nvtx::kNoPushPopTracking;
}

int rangePushEx(const nvtx::EventAttributes* attributes) {
  pushedAttributes(attributes);
  return nvtx::kNoPushPopTracking;
}

int domainRangePushEx(void* /*domain*/, const nvtx::EventAttributes* attributes) {
  pushedAttributes(attributes);
  return nvtx::kNoPushPopTracking;
}

int rangePop() {
  nvtxRangePopped();
  return nvtx::kNoPushPopTracking;
}

int domainRangePop(void* /*domain*/) {
  nvtxRangePopped();
  return nvtx::kNoPushPopTracking;
}

// Writes `function` into slot `id` of a module's table, if the table has it.
template <typename Function>
void hook(nvtx::FunctionTable table, unsigned size, unsigned id, Function function) {
  if (table == nullptr || id >= size || table[id] == nullptr) return;
  *table[id] = reinterpret_cast<nvtx::FunctionPointer>(function);
}

}  // namespace
}  // namespace gradscope::agent

using namespace gradscope::agent;

// Returns 1 (attached) or 0 (NVTX then makes every call a no-op and unloads nothing that matters: the
// agent stays preloaded).
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    nvtx::GetExportTable get_export_table) {
  if (get_export_table == nullptr || !wantsNvtx()) return 0;
  const auto* callbacks =
      static_cast<const nvtx::ExportTableCallbacks*>(get_export_table(nvtx::kExportTableCallbacks));
  if (callbacks == nullptr || callbacks->GetModuleFunctionTable == nullptr) return 0;
  nvtx::FunctionTable core = nullptr;
  unsigned core_size = 0;
  if (callbacks->GetModuleFunctionTable(nvtx::kModuleCore, &core, &core_size) == 0) return 0;
  hook(core, core_size, nvtx::kCoreRangePushA, &rangePushA);
  hook(core, core_size, nvtx::kCoreRangePushW, &rangePushW);
  hook(core, core_size, nvtx::kCoreRangePushEx, &rangePushEx);
  hook(core, core_size, nvtx::kCoreRangePop, &rangePop);
  nvtx::FunctionTable core2 = nullptr;
  unsigned core2_size = 0;
  if (callbacks->GetModuleFunctionTable(nvtx::kModuleCore2, &core2, &core2_size) != 0) {
    hook(core2, core2_size, nvtx::kCore2DomainRangePushEx, &domainRangePushEx);
    hook(core2, core2_size, nvtx::kCore2DomainRangePop, &domainRangePop);
  }
  const auto* version =
      static_cast<const nvtx::ExportTableVersionInfo*>(get_export_table(nvtx::kExportTableVersionInfo));
  if (version != nullptr && version->struct_size >= sizeof(nvtx::ExportTableVersionInfo) &&
      version->SetInjectionNvtxVersion != nullptr)
    version->SetInjectionNvtxVersion(nvtx::kVersion);
  return 1;
}
