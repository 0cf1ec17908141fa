#include "sdk/runtime/metrics.hpp"

namespace tenure::detail {

runtime_metrics live_metrics::snapshot() const {
  runtime_metrics r;
#define TENURE_SNAP_counter(field) r.field = field.load(std::memory_order_relaxed);
#define TENURE_SNAP_gauge(field) r.field = field.load(std::memory_order_relaxed);
#define TENURE_SNAP_state(field)
#define TENURE_SNAP_METRIC(kind, type, field, name, help) TENURE_SNAP_##kind(field)
  TENURE_RUNTIME_METRICS(TENURE_SNAP_METRIC)
#undef TENURE_SNAP_METRIC
#undef TENURE_SNAP_state
#undef TENURE_SNAP_gauge
#undef TENURE_SNAP_counter
  return r;
}

namespace {

void append(std::string& out, const char* name, const char* help, const char* type, const std::string& value) {
  out += std::string{"# HELP tenure_"} + name + " " + help + "\n# TYPE tenure_" + name + " " + type + "\ntenure_" +
         name + " " + value + "\n";
}

}  // namespace

std::string prometheus_text(const runtime_metrics& r) {
  std::string out;
#define TENURE_PROM_counter(field, name, help) \
  append(out, name, help, "counter", std::to_string(static_cast<std::uint64_t>(r.field)));
#define TENURE_PROM_gauge(field, name, help) \
  append(out, name, help, "gauge", std::to_string(static_cast<std::int64_t>(r.field)));
#define TENURE_PROM_state(field, name, help) TENURE_PROM_gauge(field, name, help)
#define TENURE_PROM_METRIC(kind, type, field, name, help) TENURE_PROM_##kind(field, name, help)
  TENURE_RUNTIME_METRICS(TENURE_PROM_METRIC)
#undef TENURE_PROM_METRIC
#undef TENURE_PROM_state
#undef TENURE_PROM_gauge
#undef TENURE_PROM_counter
  return out;
}

}  // namespace tenure::detail
