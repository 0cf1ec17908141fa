#pragma once
/// \file
/// A uniquely named SQLite database file for one test, removed (with its WAL files) on scope exit.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace tenure::sqlite::test {

class temp_db {
 public:
  temp_db() {
    auto pattern = (std::filesystem::temp_directory_path() / "tenure-sqlite-XXXXXX").string();
    const int fd = ::mkstemp(pattern.data());  // an empty file is a valid, empty database
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    ::close(fd);
    path_ = pattern;
  }
  ~temp_db() {
    std::error_code ignored;
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      std::filesystem::remove(path_ + suffix, ignored);
    }
  }
  temp_db(const temp_db&) = delete;
  temp_db& operator=(const temp_db&) = delete;

  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

}  // namespace tenure::sqlite::test
