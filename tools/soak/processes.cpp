// The soak's worker processes (processes.hpp).
#include "soak/processes.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace tenure::soak {
namespace {

using namespace std::chrono_literals;

/// /proc/<pid>/status fields, in MB (0 when the process is gone).
double proc_status_mb(pid_t pid, const char* field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  const std::string key = std::string{field} + ":";
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size())) / 1024.0;
  }
  return 0;
}

}  // namespace

worker_processes::worker_processes(const options& opts, const names& n, std::string log_dir, std::size_t count)
    : opts_(opts), n_(n), log_dir_(std::move(log_dir)), slots_(count) {}

std::string worker_processes::name_of(std::size_t i) const {
  return "w" + std::to_string(i + 1) + "-" + std::to_string(slots_[i].incarnation);
}

void worker_processes::spawn(std::size_t i) {
  std::lock_guard lock{mu_};
  auto& s = slots_[i];
  ++s.incarnation;
  const std::string name = name_of(i);
  const std::string log = log_dir_ + "/" + name + ".log";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("soak: fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
    }
    ::execl(opts_.self_exe.c_str(), opts_.self_exe.c_str(), "soak", "--worker", name.c_str(), "--database-url",
            opts_.dsn.c_str(), "--schema", n_.tenure.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  s.pid = pid;
}

bool worker_processes::alive(std::size_t i) {
  std::lock_guard lock{mu_};
  auto& s = slots_[i];
  if (s.pid <= 0) return false;
  int status = 0;
  if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
    s.pid = -1;
    record_exit(i, status);
    return false;
  }
  return true;
}

/// A worker that ended without being killed: how it ended and the end of its log, for the report.
void worker_processes::record_exit(std::size_t i, int status) {
  const std::string name = name_of(i);
  const bool crashed = WIFSIGNALED(status);
  const std::string how = crashed ? "signal " + std::to_string(WTERMSIG(status))
                                  : "exit " + std::to_string(WEXITSTATUS(status));
  std::string tail;
  if (std::ifstream in{log_dir_ + "/" + name + ".log"}) {
    std::string line;
    std::deque<std::string> last;
    while (std::getline(in, line)) {
      last.push_back(line);
      if (last.size() > 3) last.pop_front();
    }
    for (const auto& l : last) tail += (tail.empty() ? "" : "\n") + l;
  }
  if (crashed) ++crashes_;
  exits_.push_back({{"worker", name}, {"how", how}, {"log_tail", tail}});
  std::fprintf(stderr, "soak: worker %s ended by itself (%s): %s\n", name.c_str(), how.c_str(), tail.c_str());
}

void worker_processes::kill(std::size_t i) {
  pid_t pid;
  {
    std::lock_guard lock{mu_};
    pid = slots_[i].pid;
    slots_[i].pid = -1;
  }
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::lock_guard lock{mu_};
  ++kills_;
}

void worker_processes::stop_all() {
  std::vector<pid_t> pids;
  {
    std::lock_guard lock{mu_};
    for (auto& s : slots_) {
      if (s.pid > 0) pids.push_back(s.pid), s.pid = -1;
    }
  }
  for (pid_t pid : pids) ::kill(pid, SIGTERM);
  for (pid_t pid : pids) {
    const auto until = std::chrono::steady_clock::now() + 15s;
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(50ms);
    }
  }
}

nlohmann::json worker_processes::sample_rss_mb() {
  nlohmann::json rss = nlohmann::json::array();
  std::lock_guard lock{mu_};
  for (auto& s : slots_) {
    const double now_mb = s.pid > 0 ? proc_status_mb(s.pid, "VmRSS") : 0;
    if (s.pid > 0) s.peak_rss_mb = std::max(s.peak_rss_mb, proc_status_mb(s.pid, "VmHWM"));
    rss.push_back(rounded(now_mb));
  }
  return rss;
}

nlohmann::json worker_processes::peak_rss_mb() {
  nlohmann::json peaks = nlohmann::json::array();
  std::lock_guard lock{mu_};
  for (const auto& s : slots_) peaks.push_back(rounded(s.peak_rss_mb));
  return peaks;
}

nlohmann::json worker_processes::exits() {
  std::lock_guard lock{mu_};
  return exits_;
}

long worker_processes::crashes() {
  std::lock_guard lock{mu_};
  return crashes_;
}

long worker_processes::kills() {
  std::lock_guard lock{mu_};
  return kills_;
}

}  // namespace tenure::soak
