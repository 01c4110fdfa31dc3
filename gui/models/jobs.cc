#include "models/jobs.h"

#include <sys/stat.h>

#include <utility>

#include "models/sql.h"

namespace gradscope::gui {

namespace {
std::atomic<int> g_in_flight{0};

struct CachedReader {
  dev_t device = 0;
  ino_t inode = 0;
  std::unique_ptr<storage::TraceReader> reader;
};
// Per pool thread; a handful of files at most (the trace and a comparison baseline).
thread_local std::map<std::string, CachedReader> t_readers;
}  // namespace

int jobsInFlight() {
  return g_in_flight.load();
}
void detail::jobStarted() {
  ++g_in_flight;
}
void detail::jobEnded() {
  --g_in_flight;
}

const storage::TraceReader& threadReader(const std::string& path) {
  struct stat info {};
  const bool exists = ::stat(path.c_str(), &info) == 0;
  auto found = t_readers.find(path);
  if (found != t_readers.end() && exists && found->second.device == info.st_dev &&
      found->second.inode == info.st_ino) {
    return *found->second.reader;
  }
  if (found != t_readers.end()) t_readers.erase(found);
  // open() reports a missing file itself, with its own message.
  auto reader = std::make_unique<storage::TraceReader>(storage::TraceReader::open(path));
  if (t_readers.size() >= 4) t_readers.clear();
  CachedReader& cached = t_readers[path];
  cached.device = exists ? info.st_dev : 0;
  cached.inode = exists ? info.st_ino : 0;
  cached.reader = std::move(reader);
  return *cached.reader;
}

namespace {
struct CachedDatabase {
  dev_t device = 0;
  ino_t inode = 0;
  std::unique_ptr<ReadOnlyDatabase> database;
};
thread_local std::map<std::string, CachedDatabase> t_databases;
}  // namespace

void dropThreadReader(const std::string& path) {
  t_readers.erase(path);
  t_databases.erase(path);
}

ReadOnlyDatabase& threadDatabase(const std::string& path) {
  struct stat info {};
  const bool exists = ::stat(path.c_str(), &info) == 0;
  auto found = t_databases.find(path);
  if (found != t_databases.end() && exists && found->second.device == info.st_dev &&
      found->second.inode == info.st_ino) {
    return *found->second.database;
  }
  if (found != t_databases.end()) t_databases.erase(found);
  auto database = std::make_unique<ReadOnlyDatabase>(path);
  if (t_databases.size() >= 4) t_databases.clear();
  CachedDatabase& cached = t_databases[path];
  cached.device = exists ? info.st_dev : 0;
  cached.inode = exists ? info.st_ino : 0;
  cached.database = std::move(database);
  return *cached.database;
}

}  // namespace gradscope::gui
