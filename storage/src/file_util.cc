#include "file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <random>

#include "gradscope/common/error.h"
#include "gradscope/storage/files.h"

namespace gradscope::storage::detail {

std::string parentDirectory(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

namespace {

[[noreturn]] void failCreate(const std::string& path, int errnum) {
  switch (errnum) {
    case EEXIST: fail("{}: already exists; remove it or choose another output", path);
    case ENOENT: fail("{}: directory '{}' does not exist; create it first", path, parentDirectory(path));
    case EACCES:
    case EPERM:
    case EROFS: fail("{}: cannot create: directory '{}' is not writable", path, parentDirectory(path));
    case ENOSPC: fail("{}: cannot create: no space left on the device", path);
    default: fail("{}: cannot create: {}", path, errnoMessage(errnum));
  }
}

}  // namespace

void createPrivateFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) failCreate(path, errno);
  // The umask can only remove bits; make the mode exactly 0600 whatever it is.
  ::fchmod(fd, 0600);
  ::close(fd);
}

FileIdentity fileIdentity(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return {};
  return {static_cast<unsigned long long>(info.st_dev), static_cast<unsigned long long>(info.st_ino)};
}

void removeDatabaseFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((path + suffix).c_str());
}

AtomicOutput::AtomicOutput(std::string destination, bool overwrite, bool create_empty)
    : destination_(std::move(destination)) {
  struct stat info {};
  if (::stat(destination_.c_str(), &info) == 0) {
    if (!overwrite) fail("{}: already exists; remove it or pass --force to replace it", destination_);
    if (S_ISDIR(info.st_mode)) fail("{}: is a directory; name an output file", destination_);
  }
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    const std::filesystem::path dest(destination_);
    const std::filesystem::path name = "." + dest.filename().string() + fmt::format(".tmp-{:08x}", random());
    temporary_ = (dest.parent_path() / name).string();
    if (!create_empty) {
      struct stat existing {};
      if (::stat(temporary_.c_str(), &existing) != 0) {
        if (::access(parentDirectory(destination_).c_str(), W_OK) != 0) {
          const int errnum = errno;
          temporary_.clear();
          failCreate(destination_, errnum);
        }
        return;
      }
      continue;
    }
    const int fd = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::fchmod(fd, 0600);
      ::close(fd);
      return;
    }
    if (errno != EEXIST || attempt == 8) {
      const int errnum = errno;
      temporary_.clear();
      failCreate(destination_, errnum);
    }
  }
}

AtomicOutput::~AtomicOutput() {
  if (!committed_ && !temporary_.empty()) removeDatabaseFiles(temporary_);
}

void AtomicOutput::commit() {
  if (::rename(temporary_.c_str(), destination_.c_str()) != 0)
    fail("{}: cannot move the finished output into place: {}", destination_, errnoMessage(errno));
  committed_ = true;
}

}  // namespace gradscope::storage::detail

namespace gradscope::storage {

void writePrivateFile(const std::string& path, std::string_view text) {
  detail::AtomicOutput output(path, /*overwrite=*/true);
  const int fd = ::open(output.temporaryPath().c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot write: {}", path, errnoMessage(errno));
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int errnum = n < 0 ? errno : EIO;
      ::close(fd);
      fail("{}: cannot write: {}", path, errnoMessage(errnum));
    }
    written += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) fail("{}: cannot write: {}", path, errnoMessage(errno));
  output.commit();
}

}  // namespace gradscope::storage
