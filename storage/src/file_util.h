#pragma once

// File-system helpers shared by the writer, merge and export. Internal to storage/.

#include <string>

namespace gradscope::storage::detail {

// The directory holding `path` ("." for a bare file name).
std::string parentDirectory(const std::string& path);

// Creates an empty file with mode 0600 (O_EXCL): fails with a clear message when it exists, its
// directory is missing or not writable.
void createPrivateFile(const std::string& path);

// Which file a path names (device and inode), to notice a file removed or replaced behind a writer's
// back; a missing file is the default value.
struct FileIdentity {
  unsigned long long device = 0;
  unsigned long long inode = 0;
  bool operator==(const FileIdentity&) const = default;
};
FileIdentity fileIdentity(const std::string& path);

// Removes a database file and its -wal, -shm and -journal companions, ignoring missing ones.
void removeDatabaseFiles(const std::string& path);

// An output that appears under its final name only when complete: written to a private temporary file
// beside the destination and renamed over it by commit(); removed if destroyed uncommitted.
class AtomicOutput {
 public:
  // Fails early (before any work) when the destination exists and `overwrite` is false, or when its
  // directory does not exist or is not writable.
  // With `create_empty` false only a free name is chosen and the caller creates the file (O_EXCL).
  AtomicOutput(std::string destination, bool overwrite, bool create_empty = true);
  ~AtomicOutput();
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  // Path to write to.
  const std::string& temporaryPath() const { return temporary_; }
  const std::string& destination() const { return destination_; }
  void commit();

 private:
  std::string destination_;
  std::string temporary_;
  bool committed_ = false;
};

}  // namespace gradscope::storage::detail
