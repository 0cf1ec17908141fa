// Job validation before storage (tenure::validate(new_job)): kind, queue, priority,
// max_attempts, args, metadata and unique key, checked against an independent statement of the
// rules in both directions: what it accepts PostgreSQL stores, and what it refuses breaks a rule.
#include <fuzzer/FuzzedDataProvider.h>

#include "fuzz_check.hpp"
#include "tenure/job.hpp"

namespace {

using tenure::fuzz::code_points;
using tenure::fuzz::has_control;
using tenure::fuzz::storable;
using json = nlohmann::json;

int some_int(FuzzedDataProvider& in) {
  return in.ConsumeBool() ? in.ConsumeIntegralInRange(-2, 30) : in.ConsumeIntegral<int>();
}

/// A string of raw bytes, sometimes repeated to reach sizes past the limits.
std::string some_text(FuzzedDataProvider& in, std::size_t max) {
  std::string s = in.ConsumeRandomLengthString(max);
  if (!s.empty() && in.ConsumeBool()) {
    const auto times = in.ConsumeIntegralInRange(1, 700);
    std::string r;
    for (int i = 0; i < times; ++i) r += s;
    s = std::move(r);
  }
  return s;
}

/// A JSON value: parsed from text (nlohmann refuses invalid UTF-8 there, but not \u0000), or
/// built from raw bytes (so invalid UTF-8 reaches the check), or a scalar.
json some_json(FuzzedDataProvider& in, int depth = 0) {
  switch (in.ConsumeIntegralInRange(0, depth > 3 ? 2 : 4)) {
    case 0: return json::parse(in.ConsumeRandomLengthString(256), nullptr, false);
    case 1: return some_text(in, 64);
    case 2: return in.ConsumeBool() ? json(nullptr) : json(in.ConsumeIntegral<std::int64_t>());
    case 3: {
      json a = json::array();
      for (int n = in.ConsumeIntegralInRange(0, 4); n > 0; --n) a.push_back(some_json(in, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int n = in.ConsumeIntegralInRange(0, 4); n > 0; --n) o[some_text(in, 16)] = some_json(in, depth + 1);
      return o;
    }
  }
}

bool storable_json(const json& v) {
  if (v.is_string()) return storable(v.get_ref<const std::string&>());
  if (v.is_array()) {
    for (const auto& e : v) {
      if (!storable_json(e)) return false;
    }
  }
  if (v.is_object()) {
    for (const auto& [k, e] : v.items()) {
      if (!storable(k) || !storable_json(e)) return false;
    }
  }
  return true;
}

/// Separators of the compact form, after each of which PostgreSQL's jsonb text adds a space.
std::size_t separators(const json& v) {
  std::size_t n = 0;
  if (v.is_array()) {
    n += v.empty() ? 0 : v.size() - 1;
    for (const auto& e : v) n += separators(e);
  } else if (v.is_object()) {
    n += v.empty() ? 0 : 2 * v.size() - 1;
    for (const auto& [k, e] : v.items()) n += separators(e);
  }
  return n;
}

bool good_name(const std::string& s, std::size_t max) {
  return !s.empty() && storable(s) && code_points(s) <= max && !has_control(s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  tenure::new_job job;
  job.kind = some_text(in, 300);
  if (in.ConsumeBool()) job.queue = some_text(in, 150);
  job.priority = some_int(in);
  job.max_attempts = some_int(in);
  if (in.ConsumeBool()) job.args = some_json(in);
  if (in.ConsumeBool()) job.metadata = some_json(in);
  if (in.ConsumeBool()) job.unique_key = some_text(in, 300);

  const auto verdict = tenure::validate(job);

  bool ok = good_name(job.kind, tenure::k_max_kind_size) && good_name(job.queue, tenure::k_max_queue_size);
  ok = ok && job.priority >= tenure::k_min_priority && job.priority <= tenure::k_max_priority;
  ok = ok && job.max_attempts >= 1;
  ok = ok && (job.args.is_object() || job.args.is_null()) && storable_json(job.args);
  ok = ok && (job.metadata.is_object() || job.metadata.is_null()) && storable_json(job.metadata);
  if (ok && job.metadata.is_object()) {
    ok = job.metadata.dump().size() + separators(job.metadata) <= tenure::k_max_metadata_size;
  }
  if (ok && job.unique_key) {
    const auto& k = *job.unique_key;
    ok = !k.empty() && k.size() <= tenure::k_max_unique_key_size && storable(k) && !has_control(k);
  }

  if (verdict) {
    // Accepted: every rule holds; the priority in particular is in range.
    FUZZ_CHECK(job.priority >= tenure::k_min_priority && job.priority <= tenure::k_max_priority);
    FUZZ_CHECK(ok);
  } else {
    FUZZ_CHECK(verdict.error() == tenure::errc::invalid_argument);
    FUZZ_CHECK(!verdict.error().detail().empty());
    FUZZ_CHECK(!ok);
  }
  return 0;
}
