#pragma once
/// \file
/// A tiny HTTP server (Boost.Beast, one thread) answering GET /metrics with Prometheus text, and
/// GET /healthz and GET /readyz with 200 or 503 and a one-line reason. Private to the runtime.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "tenure/result.hpp"

namespace tenure::detail {

class metrics_server {
 public:
  using render_fn = std::function<std::string()>;
  /// A probe's answer: 200 when ok, else 503; `reason` is the body (one line).
  struct probe_answer {
    bool ok = true;
    std::string reason = "ok";
  };
  using probe_fn = std::function<probe_answer()>;
  /// Binds and starts serving. Port 0 lets the OS choose (see port()). A probe left empty
  /// always answers 200 "ok". Every function runs on the server's thread.
  static result<std::unique_ptr<metrics_server>> start(const std::string& address, std::uint16_t port,
                                                       render_fn render, probe_fn health = {}, probe_fn ready = {});
  ~metrics_server();
  std::uint16_t port() const noexcept { return port_; }
  /// Idempotent.
  void stop() noexcept;

  struct state;

 private:
  metrics_server() = default;
  std::shared_ptr<state> state_;
  std::thread thread_;
  std::uint16_t port_ = 0;
};

}  // namespace tenure::detail
