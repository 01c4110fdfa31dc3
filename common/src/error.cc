#include "gradscope/common/error.h"

#include <cstring>

namespace gradscope {

std::string errnoMessage(int errnum) {
  char buffer[256];
  // GNU strerror_r may return a static string instead of filling the buffer.
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  return strerror_r(errnum, buffer, sizeof buffer);
#else
  if (strerror_r(errnum, buffer, sizeof buffer) != 0) return fmt::format("error {}", errnum);
  return buffer;
#endif
}

}  // namespace gradscope
