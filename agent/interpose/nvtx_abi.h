#pragma once

// The NVTX v3 injection interface, as far as the agent uses it: NVTX's header-only API looks for an
// injection library named by NVTX_INJECTION64_PATH, calls its InitializeInjectionNvtx2 with a function
// that returns export tables, and the library writes its implementations into the API's function
// tables. Declared here from the NVTX v3 headers (CUDA 13 /usr/local/cuda/include/nvtx3:
// nvtxDetail/nvtxTypes.h, nvtxDetail/nvtxInit.h, nvToolsExt.h) so the agent builds without them;
// abi_check.cc compares them whenever those headers are present.

#include <cstddef>
#include <cstdint>

namespace gradscope::agent::nvtx {

// nvtxTypes.h: `typedef void (*NvtxFunctionPointer)(void); typedef NvtxFunctionPointer** NvtxFunctionTable;`
// — a table of pointers to the API's function-pointer slots.
using FunctionPointer = void (*)();
using FunctionTable = FunctionPointer**;

// nvtxTypes.h NvtxExportTableID: NVTX_ETID_CALLBACKS = 1, NVTX_ETID_VERSIONINFO = 3.
inline constexpr std::uint32_t kExportTableCallbacks = 1;
inline constexpr std::uint32_t kExportTableVersionInfo = 3;

// nvtxTypes.h NvtxCallbackModule: NVTX_CB_MODULE_CORE = 1, NVTX_CB_MODULE_CORE2 = 5.
enum CallbackModule { kModuleCore = 1, kModuleCore2 = 5 };

// nvtxTypes.h NvtxCallbackIdCore: RangePushEx = 8, RangePushA = 9, RangePushW = 10, RangePop = 11;
// NvtxCallbackIdCore2: DomainRangePushEx = 4, DomainRangePop = 5.
inline constexpr unsigned kCoreRangePushEx = 8;
inline constexpr unsigned kCoreRangePushA = 9;
inline constexpr unsigned kCoreRangePushW = 10;
inline constexpr unsigned kCoreRangePop = 11;
inline constexpr unsigned kCore2DomainRangePushEx = 4;
inline constexpr unsigned kCore2DomainRangePop = 5;

// nvtxTypes.h NvtxExportTableCallbacks.
struct ExportTableCallbacks {
  std::size_t struct_size;
  int (*GetModuleFunctionTable)(CallbackModule module, FunctionTable* out_table, unsigned int* out_size);
};

// nvtxTypes.h NvtxExportTableVersionInfo.
struct ExportTableVersionInfo {
  std::size_t struct_size;
  std::uint32_t version;
  std::uint32_t reserved0;
  void (*SetInjectionNvtxVersion)(std::uint32_t version);
};

// nvToolsExt.h: NVTX_VERSION 3; NVTX_MESSAGE_TYPE_ASCII = 1, NVTX_MESSAGE_TYPE_UNICODE = 2;
// NVTX_NO_PUSH_POP_TRACKING = -2 (what a push returns when the tool does not count levels).
inline constexpr std::uint32_t kVersion = 3;
inline constexpr std::int32_t kMessageAscii = 1;
inline constexpr std::int32_t kMessageUnicode = 2;
inline constexpr int kNoPushPopTracking = -2;

// nvToolsExt.h `struct nvtxEventAttributes_v2` (nvtxEventAttributes_t).
struct EventAttributes {
  std::uint16_t version;
  std::uint16_t size;
  std::uint32_t category;
  std::int32_t colorType;
  std::uint32_t color;
  std::int32_t payloadType;
  std::int32_t reserved0;
  union {
    std::uint64_t ullValue;
    std::int64_t llValue;
    double dValue;
    std::uint32_t uiValue;
    std::int32_t iValue;
    float fValue;
  } payload;
  std::int32_t messageType;
  union {
    const char* ascii;
    const wchar_t* unicode;
    const void* registered;  // nvtxStringHandle_t
  } message;
};

// nvtxTypes.h: `typedef const void* (*NvtxGetExportTableFunc_t)(uint32_t exportTableId);` and the
// injection library's entry point `int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t)`.
using GetExportTable = const void* (*)(std::uint32_t export_table_id);
using InitializeInjection = int (*)(GetExportTable get_export_table);

}  // namespace gradscope::agent::nvtx
