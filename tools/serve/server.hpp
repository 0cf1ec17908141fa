#pragma once
/// \file
/// The HTTP/1.1 server of `tenure serve`: one I/O thread for every connection (asynchronous, so a
/// slow or silent client holds only its own connection), handlers on a small thread pool (so a
/// slow database holds no socket), limits on headers, bodies, time and connections.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "serve/http.hpp"

namespace tenure::serve {

struct server_limits {
  std::size_t header_limit = 8 * 1024;   ///< request line + headers; more: 431
  std::size_t body_limit = 16 * 1024;    ///< request body; more: 413
  std::chrono::seconds io_timeout{10};   ///< to send a whole request, and to read the answer
  std::chrono::seconds idle_timeout{30}; ///< a kept-alive connection with no next request
  int max_connections = 128;             ///< past this, new connections are closed at once
  int handler_threads = 2;               ///< requests handled at the same time
};

/// Called on a handler thread for every complete request; must not throw.
using handler_fn = std::function<response(const request&)>;
/// Called on the I/O thread for every answer the server makes itself (431, 413, 400).
using refusal_fn = std::function<void(unsigned status)>;

class server {
 public:
  /// Binds `address:port` (port 0: any free port); throws std::runtime_error when it cannot.
  server(const std::string& address, std::uint16_t port, server_limits limits, handler_fn handler,
         refusal_fn on_refusal);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  std::uint16_t port() const noexcept;
  /// Serves until SIGINT or SIGTERM.
  void run();

  struct state;

 private:
  std::shared_ptr<state> state_;
};

}  // namespace tenure::serve
