#include "core/symbols.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>

namespace gradscope::agent {
namespace {

struct Search {
  const char* name;
  void* found;
  void* self_base;
};

int visitObject(dl_phdr_info* info, std::size_t, void* data) {
  auto* search = static_cast<Search*>(data);
  if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
  if (reinterpret_cast<void*>(info->dlpi_addr) == search->self_base) return 0;
  // RTLD_NOLOAD: only a handle to an object that is already loaded; never loads anything.
  void* handle = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return 0;
  void* symbol = dlsym(handle, search->name);
  dlclose(handle);
  if (symbol == nullptr) return 0;
  search->found = symbol;
  return 1;
}

// Every loaded object but the agent, in load order.
void* searchLoadedObjects(const char* name) {
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&searchLoadedObjects), &self);
  Search search{name, nullptr, self.dli_fbase};
  dl_iterate_phdr(visitObject, &search);
  return search.found;
}

}  // namespace

void* findNextSymbol(const char* name) {
  if (void* symbol = dlsym(RTLD_NEXT, name)) return symbol;
  return searchLoadedObjects(name);
}

void* findDataSymbol(const char* name) {
  if (void* symbol = dlsym(RTLD_DEFAULT, name)) return symbol;
  return searchLoadedObjects(name);
}

}  // namespace gradscope::agent
