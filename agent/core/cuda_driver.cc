#include "core/cuda_driver.h"

#include <dlfcn.h>

#include <cstring>

#include <fmt/format.h>

namespace gradscope::agent::cuda {

bool loadDriver(Driver& driver, std::string& why) {
  // RTLD_NOLOAD: a handle only when the job has loaded the driver already. The handle is kept (never
  // dlclose'd) so that the library stays as long as the agent may call it.
  void* library = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) {
    why = "libcuda.so.1 is not loaded in this process";
    return false;
  }
  Driver loaded;
  auto find = [&](const char* symbol, const char* fallback) -> void* {
    void* address = dlsym(library, symbol);
    if (address == nullptr && fallback[0] != '\0') address = dlsym(library, fallback);
    return address;
  };
#define GS_CUDA_DRIVER_LOAD(MEMBER, SYMBOL, FALLBACK, RESULT, PARAMS)          \
  loaded.MEMBER = reinterpret_cast<RESULT(*) PARAMS>(find(#SYMBOL, FALLBACK)); \
  if (loaded.MEMBER == nullptr) {                                              \
    why = fmt::format("libcuda.so.1 has no {} (driver too old?)", #SYMBOL);    \
    return false;                                                              \
  }
  GS_CUDA_DRIVER_FUNCTIONS(GS_CUDA_DRIVER_LOAD)
#undef GS_CUDA_DRIVER_LOAD
  driver = loaded;
  return true;
}

}  // namespace gradscope::agent::cuda
