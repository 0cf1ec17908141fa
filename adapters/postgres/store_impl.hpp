#pragma once
/// \file
/// Private to the PostgreSQL store: the statements it runs, its connection pool (store::impl)
/// and the parameter helpers its files share (store.cpp: opening, producers and workers;
/// store_callbacks.cpp; store_admin.cpp: administration, maintenance and queues).
#include "tenure/postgres/store.hpp"

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "connection.hpp"
#include "tenure/log.hpp"

namespace tenure::postgres {
namespace detail {

/// Every statement the store runs, named for logs. Built once per schema (statements.cpp).
struct statements {
  explicit statements(const std::string& s);

  statement enqueue, enqueue_batch, claim, heartbeat, complete, fail, snooze, cancel_attempt, checkpoint, register_callback,
      await_callback, park_callback, resume_callback, extend_callback, complete_callback, fail_callback, cancel_job,
      retry_job, read_job, rescue, promote, maintain, evidence, evidence_batch, version, configure_queue,
      pause_queue, resume_queue, update_queue, dead_rows, copy_target, copy_move, copy_ready_ids,
      queue_depths;
};

inline param text(std::string_view s) { return std::string{s}; }

inline param number(std::int64_t v) { return std::to_string(v); }

}  // namespace detail

// What the store's files name without detail::.
using detail::connection;
using detail::effect;
using detail::number;
using detail::param;
using detail::text;

struct store::impl {
  store_options opt;
  detail::statements st;
  std::mutex mu;
  std::condition_variable freed;
  std::vector<std::unique_ptr<detail::connection>> idle;
  int borrowed = 0;

  explicit impl(store_options o) : opt(std::move(o)), st(opt.schema) {}

  /// Borrows a connection (reopening a broken one), runs `fn(connection&)`, returns it.
  template <class Fn>
  auto with_connection(Fn&& fn) -> decltype(fn(std::declval<detail::connection&>())) {
    std::unique_ptr<detail::connection> c;
    {
      std::unique_lock lock(mu);
      if (!freed.wait_for(lock, opt.acquire_timeout, [&] {
            return !idle.empty() || borrowed + static_cast<int>(idle.size()) < opt.pool_size;
          })) {
        tenure::logger()->warn("tenure.pg: no free connection after {} ms (pool size {})",
                     opt.acquire_timeout.count(), opt.pool_size);
        return errc::database_unavailable;
      }
      if (!idle.empty()) {
        c = std::move(idle.back());
        idle.pop_back();
      }
      ++borrowed;
    }
    auto give_back = [&](std::unique_ptr<detail::connection> conn) {
      std::lock_guard lock(mu);
      --borrowed;
      if (conn && conn->ok()) idle.push_back(std::move(conn));
      freed.notify_one();
    };
    if (!c || !c->ok()) {
      auto opened = open_connection();
      if (!opened) {
        tenure::logger()->warn("tenure.pg: {}", opened.error().message());
        give_back(nullptr);
        return opened.error();
      }
      c = std::move(opened).value();
    }
    auto r = fn(*c);
    c->reset_transaction();
    give_back(std::move(c));
    return r;
  }

  result<std::unique_ptr<detail::connection>> open_connection() {
    return detail::connection::open(opt.dsn, opt.application_name, opt.lock_timeout,
                            opt.pool_mode == pool_mode::session ? detail::session_use::keep
                                                                : detail::session_use::none);
  }

  result<detail::rows> run(const detail::statement& s, std::vector<detail::param> params, detail::effect e) {
    return with_connection([&](detail::connection& c) { return c.exec(s, params, e); });
  }

  /// run() of a statement that answers one boolean (a function returning whether it acted).
  result<bool> yes_no(const detail::statement& s, std::vector<detail::param> params) {
    TENURE_TRY(auto rows, run(s, std::move(params), detail::effect::write));
    return rows.boolean(0, 0);
  }
};

}  // namespace tenure::postgres
