#pragma once
// A small HTTP/1.1 server and client on Boost.Beast, enough for the sample's three roles.
//
// Server: one I/O thread accepts connections and reads/writes asynchronously (every read and
// write has a deadline); each parsed request is handed to a thread pool, because the sample's
// handlers block (database calls, the fake provider's artificial delay). Bodies above
// `max_body` are refused with 413 before they are read.
// Client: a blocking call with one deadline for connect + write + read.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace billing {

namespace http = boost::beast::http;
using request = http::request<http::string_body>;
using response = http::response<http::string_body>;

/// A JSON response (Content-Type: application/json).
response json_response(http::status status, const nlohmann::json& body);
/// {"error": message} with `status`.
response error_response(http::status status, std::string_view message);
response text_response(http::status status, std::string body, std::string_view content_type = "text/plain");

class http_server {
 public:
  using handler = std::function<response(const request&)>;
  struct options {
    std::string name = "http";           ///< for logs
    std::size_t max_body = 16 * 1024;    ///< larger bodies get 413
    int handler_threads = 8;             ///< requests handled at once
    std::chrono::milliseconds io_timeout{30'000};  ///< per read (idle keep-alive) and per write
  };

  http_server(options opts, handler fn);
  ~http_server();  ///< stop()s
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// Binds host:port (port 0: the OS picks one) and starts serving. false with `error` set when
  /// the address cannot be bound.
  bool start(const std::string& host, std::uint16_t port, std::string* error);
  /// http://host:port of the bound socket.
  std::string url() const;
  /// Stops accepting, lets requests being handled finish, then stops. Idempotent.
  void stop() noexcept;

 struct state;  ///< implementation detail (http.cpp)

 private:
  std::unique_ptr<state> st_;
};

/// "host:port" -> (host, port); nullopt when malformed.
std::optional<std::pair<std::string, std::uint16_t>> parse_host_port(std::string_view text);

struct http_reply {
  int status = 0;
  std::string body;
  std::string content_type;
};

/// One request to `url` (http://host:port/path, no TLS) with a deadline covering connect, write
/// and read. nullopt with `error` set when no complete response arrived in time.
std::optional<http_reply> http_call(std::string_view url, http::verb method, std::string body,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    std::chrono::milliseconds timeout, std::string* error);

}  // namespace billing
