#include "bench/common.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>

namespace tenure::bench {

using namespace std::chrono_literals;

double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

namespace {
/// Every "Name:   N kB" line of /proc/self/status, in MB, from one read of the file.
std::map<std::string, double> status_mb() {
  std::map<std::string, double> mb;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || !line.ends_with(" kB")) continue;
    mb[line.substr(0, colon)] = std::stod(line.substr(colon + 1)) / 1024.0;
  }
  return mb;
}
}  // namespace

double peak_rss_mb() { return status_mb()["VmHWM"]; }

rss_split resident_now() {
  auto mb = status_mb();
  return {mb["RssAnon"], mb["RssFile"] + mb["RssShmem"], mb["VmHWM"]};
}

std::string random_hex() {
  std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  auto v = rng();
  for (int i = 0; i < 8; ++i, v >>= 4) s += hex[v & 0xf];
  return s;
}

db_counters read_counters(pg_session& s) {
  s.query("SELECT pg_stat_clear_snapshot()", {}, "bench: stats");
  auto rows = s.query(
      "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8, xact_commit::float8, "
      "(SELECT buffers_checkpoint::float8 FROM pg_stat_bgwriter) "
      "FROM pg_stat_database WHERE datname = current_database()",
      {}, "bench: counters");
  return {std::stod(*rows.at(0).at(0)), std::stod(*rows.at(0).at(1)), std::stod(*rows.at(0).at(2))};
}

void settle() { std::this_thread::sleep_for(600ms); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto idx = static_cast<std::size_t>(std::min<double>(v.size() - 1, std::ceil(p * v.size()) - 1));
  return v[idx];
}

std::shared_ptr<postgres::store> open_store(const std::string& dsn, const std::string& schema, int pool,
                                            std::size_t copy_threshold) {
  auto st = postgres::store::open({.dsn = dsn, .schema = schema, .pool_size = pool, .copy_threshold = copy_threshold});
  if (!st) throw std::runtime_error("bench: cannot open the store: " + st.error().message());
  return std::shared_ptr<postgres::store>(std::move(st).value());
}

double enqueue_batches(const std::string& dsn, const std::string& schema, int n, const std::string& kind,
                       const nlohmann::json& metadata, const std::string& queue, bool arrays) {
  auto store = open_store(dsn, schema, 1, arrays ? 0 : postgres::store_options{}.copy_threshold);
  const auto t0 = clock::now();
  std::vector<new_job> chunk;
  for (int done = 0; done < n;) {
    const int k = std::min(5'000, n - done);
    chunk.assign(static_cast<std::size_t>(k), new_job{.kind = kind, .queue = queue, .metadata = metadata});
    auto ids = store->enqueue_batch(chunk);
    if (!ids) throw std::runtime_error("bench: enqueue failed: " + ids.error().message());
    done += k;
  }
  return n / seconds_since(t0);
}

runtime_config drain_config(const options& o) {
  runtime_config c;
  if (o.reclaim_dead_rows >= 0) c.reclaim_dead_rows = o.reclaim_dead_rows;
  c.queues = {{.name = k_queue, .max_concurrency = 2'048}};
  c.handler_threads = 2;
  c.claim_batch = 1'000;
  c.completion_batch = 2'000;
  c.flush_delay = 2ms;
  c.heartbeat_interval = 5s;
  c.poll_interval = 1s;
  c.maintenance_interval = 1s;
  return c;
}

std::unique_ptr<runtime> make_runtime(const std::string& dsn, const std::string& schema, runtime_config cfg) {
  auto rt = postgres::make_runtime({.dsn = dsn, .schema = schema, .pool_size = 4, .runtime = std::move(cfg)});
  if (!rt) throw std::runtime_error("bench: cannot create the runtime: " + rt.error().message());
  return std::move(rt).value();
}

void wait_for(const std::function<bool()>& done, std::chrono::seconds limit, const char* what) {
  const auto until = clock::now() + limit;
  while (!done()) {
    if (clock::now() > until) throw std::runtime_error(std::string{"bench: timed out waiting for "} + what);
    // A millisecond apart: the measured phases run on the same cores, and a tighter loop would
    // spend their context switches (5,000 wake-ups a second at 200 us, ~2.5 per caller-owned job).
    std::this_thread::sleep_for(1ms);
  }
}

double rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

std::vector<double> pickup_latencies(const std::string& dsn, const std::string& schema,
                                     std::atomic<std::int64_t>& last_start_ns, std::atomic<std::int64_t>& last_job,
                                     int samples) {
  pg_session producer(dsn);
  std::vector<double> out;
  std::mt19937 rng{42};
  for (int i = 0; i < samples; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 30));  // an idle worker
    auto rows = producer.query("SELECT " + schema + ".enqueue('noop', '{}', '" + k_queue + "')", {}, "bench: enqueue");
    const auto committed = clock::now();
    const auto id = std::stoll(*rows.at(0).at(0));
    wait_for([&] { return last_job.load() == id; }, 30s, "a pickup");
    const auto started = clock::time_point{clock::duration{last_start_ns.load()}};
    out.push_back(std::max(0.0, std::chrono::duration<double, std::milli>(started - committed).count()));
  }
  return out;
}

}  // namespace tenure::bench
