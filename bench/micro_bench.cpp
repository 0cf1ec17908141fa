// Google Benchmark micro-benchmarks of hot paths that do not need a server. End-to-end figures
// against PostgreSQL come from `tenure bench` (tools/bench). Run: build/bench/tenure_micro_bench
#include <benchmark/benchmark.h>

#include "tenure/postgres/sql_text.hpp"
#include "tenure/sqlite/store.hpp"
#include "tenure/clock.hpp"
#include "tenure/job.hpp"
#include "tenure/token.hpp"

namespace {

void token_parse(benchmark::State& state) {
  const std::string text = tenure::finalization_token{{123456789, 42}, {}}.to_string();
  for (auto _ : state) benchmark::DoNotOptimize(tenure::finalization_token::parse(text));
}
BENCHMARK(token_parse);

void token_to_string(benchmark::State& state) {
  const tenure::finalization_token t{{123456789, 42}, {}};
  for (auto _ : state) benchmark::DoNotOptimize(t.to_string());
}
BENCHMARK(token_to_string);

void validate_job(benchmark::State& state) {
  const tenure::new_job j{.kind = "send_welcome_email", .args = {{"user", 42}}, .queue = "mail"};
  for (auto _ : state) benchmark::DoNotOptimize(tenure::validate(j));
}
BENCHMARK(validate_job);

/// One enqueue-batch / claim / complete cycle of N jobs on the SQLite fake: the engine-side cost
/// of the protocol without network or server.
void sqlite_cycle(benchmark::State& state) {
  tenure::manual_clock clock;
  auto store = tenure::sqlite::store::open(":memory:", clock).value();
  const auto n = static_cast<int>(state.range(0));
  std::vector<tenure::new_job> jobs(static_cast<std::size_t>(n), tenure::new_job{.kind = "k"});
  for (auto _ : state) {
    (void)store->enqueue_batch(jobs);
    auto claimed = store->claim("default", n, "bench").value();
    std::vector<tenure::completion> done;
    for (const auto& c : claimed) done.push_back({c.attempt, std::nullopt});
    benchmark::DoNotOptimize(store->complete(done));
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(sqlite_cycle)->Arg(100)->Arg(1000);

/// The client's side of a COPY straight into ready: checking N jobs and writing their COPY text.
void copy_ready_rows(benchmark::State& state) {
  const std::vector<tenure::new_job> jobs(static_cast<std::size_t>(state.range(0)),
                                          tenure::new_job{.kind = "noop", .args = {{"user", 42}}, .queue = "mail"});
  for (auto _ : state) benchmark::DoNotOptimize(tenure::postgres::enqueue_copy_ready_rows(jobs));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(copy_ready_rows)->Arg(5000);

}  // namespace

BENCHMARK_MAIN();
