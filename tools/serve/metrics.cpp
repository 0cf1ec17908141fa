#include "serve/metrics.hpp"

#include <cstdio>

namespace tenure::serve {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

void metrics::record(const std::string& route, unsigned status, double seconds) {
  std::lock_guard lock(mutex_);
  ++requests_[{route, status}];
  auto& h = durations_[route];
  for (std::size_t i = 0; i < k_buckets.size(); ++i) {
    if (seconds <= k_buckets[i]) ++h.counts[i];
  }
  ++h.count;
  h.sum += seconds;
}

void metrics::refused(unsigned status) {
  std::lock_guard lock(mutex_);
  ++requests_[{"(refused)", status}];
}

void metrics::database_error() {
  std::lock_guard lock(mutex_);
  ++database_errors_;
}

std::string metrics::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  out += "# HELP tenure_serve_requests_total HTTP requests answered, by route pattern and status.\n";
  out += "# TYPE tenure_serve_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += "tenure_serve_requests_total{route=\"" + key.first + "\",status=\"" + std::to_string(key.second) +
           "\"} " + std::to_string(n) + "\n";
  }
  out += "# HELP tenure_serve_request_duration_seconds Time to handle a request, by route pattern.\n";
  out += "# TYPE tenure_serve_request_duration_seconds histogram\n";
  for (const auto& [route, h] : durations_) {
    const std::string label = "route=\"" + route + "\"";
    for (std::size_t i = 0; i < k_buckets.size(); ++i) {
      out += "tenure_serve_request_duration_seconds_bucket{" + label + ",le=\"" + number(k_buckets[i]) + "\"} " +
             std::to_string(h.counts[i]) + "\n";
    }
    out += "tenure_serve_request_duration_seconds_bucket{" + label + ",le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    out += "tenure_serve_request_duration_seconds_sum{" + label + "} " + number(h.sum) + "\n";
    out += "tenure_serve_request_duration_seconds_count{" + label + "} " + std::to_string(h.count) + "\n";
  }
  out += "# HELP tenure_serve_database_errors_total Database queries that failed or could not connect.\n";
  out += "# TYPE tenure_serve_database_errors_total counter\n";
  out += "tenure_serve_database_errors_total " + std::to_string(database_errors_) + "\n";
  return out;
}

}  // namespace tenure::serve
