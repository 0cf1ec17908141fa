#pragma once
// A runtime over the SQLite fake behind the fault-injecting wrapper, with a manual clock the
// store reads. Loops far apart: heartbeat and maintenance run only when a test says so.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "support/eventually.hpp"
#include "tenure/clock.hpp"
#include "tenure/runtime.hpp"
#include "tenure/signal_port.hpp"
#include "tenure/sqlite/store.hpp"
#include "tenure/testing/faulty_store.hpp"

namespace tenure::test {

class sqlite_runtime_fixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = sqlite::store::open(":memory:", clock_);
    ASSERT_TRUE(s) << s.error().message();
    inner_ = std::move(s).value();
    faulty_ = std::make_shared<testing::faulty_store>(*inner_);
  }

  runtime_config config() {
    using namespace std::chrono_literals;
    runtime_config c;
    c.queues = {{.name = "default", .max_concurrency = 4}};
    c.heartbeat_interval = 1h;
    c.maintenance_interval = 1h;
    c.poll_interval = 5ms;  // no NOTIFY with SQLite: claims come from polling
    c.flush_delay = 1ms;
    c.shutdown_timeout = 5s;
    return c;
  }
  std::unique_ptr<runtime> make(runtime_config c, std::shared_ptr<signal_port> sig = nullptr) {
    auto r = runtime::create(std::move(c), faulty_, std::move(sig));
    if (!r) throw std::runtime_error(r.error().message());
    return std::move(r).value();
  }
  std::int64_t enqueue(std::string kind = "k") {
    auto id = inner_->enqueue({.kind = std::move(kind)});
    if (!id) throw std::runtime_error(id.error().message());
    return id.value();
  }
  /// Holds every claim inside the store (faulty_store::hold), enqueues one job and returns its
  /// id once a claim waits at the hold: released, it reads the store after the enqueue, so it
  /// takes the job (whether it began before the enqueue or after). The test releases op::claim.
  std::int64_t enqueue_under_a_held_claim() {
    faulty_->hold(testing::op::claim);
    const auto id = enqueue();
    if (!eventually([&] { return faulty_->waiting(testing::op::claim) > 0; })) {
      faulty_->release(testing::op::claim);  // else the runtime's stop() would wait on it forever
      throw std::runtime_error("no claim reached the hold after the enqueue");
    }
    return id;
  }
  job_state state(std::int64_t id) { return inner_->read_job(id).value().state; }

  manual_clock clock_;
  std::unique_ptr<sqlite::store> inner_;
  std::shared_ptr<testing::faulty_store> faulty_;
};

}  // namespace tenure::test
