#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace gradscope {

// The one exception type gradscope libraries throw for problems a user can act on: a missing or
// foreign file, a bad argument, an I/O failure. what() is a single line that names the problem and,
// where there is one, the fix; command-line tools print it after "gradscope: " and exit non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// strerror(errnum) without the thread-safety trap of strerror().
std::string errnoMessage(int errnum);

}  // namespace gradscope
