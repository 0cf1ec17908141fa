#pragma once
/// \file
/// The soak's worker processes (this binary in its hidden worker mode), one slot each: started,
/// watched, SIGKILLed and stopped by the orchestrator (soak.cpp). A process that ends by itself is
/// recorded with the end of its log; one that ends by a signal the soak did not send is a crash.
/// Thread-safe.
#include <sys/types.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "soak/soak.hpp"

namespace tenure::soak {

class worker_processes {
 public:
  /// `count` slots; each process logs to `<log_dir>/<name>.log` (name w<slot>-<incarnation>).
  worker_processes(const options& opts, const names& n, std::string log_dir, std::size_t count);

  std::size_t size() const noexcept { return slots_.size(); }
  /// Starts slot `i`'s next incarnation.
  void spawn(std::size_t i);
  /// Whether slot `i`'s process runs; one that ended is reaped and recorded.
  bool alive(std::size_t i);
  /// SIGKILLs slot `i`'s process and reaps it (counted in kills()).
  void kill(std::size_t i);
  /// SIGTERM to every process, SIGKILL after 15 s.
  void stop_all();

  /// Each slot's resident memory now, in MB (0 while it has no process); notes the peaks.
  nlohmann::json sample_rss_mb();
  /// Each slot's highest VmHWM over its incarnations, in MB.
  nlohmann::json peak_rss_mb();
  /// The processes that ended by themselves: worker, how, log_tail.
  nlohmann::json exits();
  long crashes();
  long kills();

 private:
  struct slot {
    pid_t pid = -1;
    int incarnation = 0;
    double peak_rss_mb = 0;
  };
  std::string name_of(std::size_t i) const;
  void record_exit(std::size_t i, int status);  // under mu_

  const options opts_;
  const names n_;
  const std::string log_dir_;
  std::mutex mu_;
  std::vector<slot> slots_;
  long crashes_ = 0, kills_ = 0;
  nlohmann::json exits_ = nlohmann::json::array();
};

}  // namespace tenure::soak
