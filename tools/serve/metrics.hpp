#pragma once
/// \file
/// The dashboard process's own metrics, served at /metrics in Prometheus text format.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace tenure::serve {

class metrics {
 public:
  /// One answered request: its route (a pattern such as /api/jobs/{id}, never the raw path, so
  /// the label set stays small), its status and how long handling took.
  void record(const std::string& route, unsigned status, double seconds);
  /// A request the server refused before routing (431, 413, 400).
  void refused(unsigned status);
  /// A query that failed on the database side (or could not reach it).
  void database_error();
  /// The whole exposition.
  std::string render() const;

 private:
  static constexpr std::array<double, 10> k_buckets{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
  struct histogram {
    std::array<std::uint64_t, k_buckets.size()> counts{};
    std::uint64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, unsigned>, std::uint64_t> requests_;
  std::map<std::string, histogram> durations_;
  std::uint64_t database_errors_ = 0;
};

}  // namespace tenure::serve
