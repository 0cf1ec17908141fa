#include "sdk/runtime/metrics_server.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <spdlog/spdlog.h>

namespace tenure::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct metrics_server::state {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  render_fn render;
  std::atomic<bool> stopping{false};
};

namespace {

void serve_one(metrics_server::state& st, tcp::socket socket) {
  beast::flat_buffer buffer;
  http::request<http::string_body> req;
  beast::error_code ec;
  http::read(socket, buffer, req, ec);
  if (ec) return;
  http::response<http::string_body> res;
  res.version(req.version());
  res.keep_alive(false);
  if (req.method() == http::verb::get && req.target() == "/metrics") {
    res.result(http::status::ok);
    res.set(http::field::content_type, "text/plain; version=0.0.4");
    res.body() = st.render();
  } else if (req.method() == http::verb::get && req.target() == "/healthz") {
    res.result(http::status::ok);
    res.set(http::field::content_type, "text/plain");
    res.body() = "ok\n";
  } else {
    res.result(http::status::not_found);
    res.set(http::field::content_type, "text/plain");
    res.body() = "not found\n";
  }
  res.prepare_payload();
  http::write(socket, res, ec);
  socket.shutdown(tcp::socket::shutdown_send, ec);
}

}  // namespace

result<std::unique_ptr<metrics_server>> metrics_server::start(const std::string& address, std::uint16_t port,
                                                             render_fn render) {
  auto st = std::make_shared<state>();
  st->render = std::move(render);
  beast::error_code ec;
  const auto addr = asio::ip::make_address(address, ec);
  if (ec) {
    spdlog::error("tenure: bad metrics address '{}': {}", address, ec.message());
    return errc::invalid_argument;
  }
  const tcp::endpoint ep{addr, port};
  st->acceptor.open(ep.protocol(), ec);
  if (!ec) st->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) st->acceptor.bind(ep, ec);
  if (!ec) st->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    spdlog::error("tenure: cannot serve metrics on {}:{}: {}", address, port, ec.message());
    return errc::invalid_argument;
  }
  std::unique_ptr<metrics_server> server{new metrics_server()};
  server->port_ = st->acceptor.local_endpoint().port();
  server->state_ = st;
  server->thread_ = std::thread([st] {
    while (!st->stopping.load()) {
      beast::error_code aec;
      tcp::socket socket{st->io};
      st->acceptor.accept(socket, aec);
      if (aec) {
        if (st->stopping.load()) break;
        continue;
      }
      serve_one(*st, std::move(socket));
    }
  });
  spdlog::info("tenure: metrics on http://{}:{}/metrics", address, server->port_);
  return server;
}

metrics_server::~metrics_server() { stop(); }

void metrics_server::stop() noexcept {
  if (!state_ || state_->stopping.exchange(true)) return;
  beast::error_code ec;
  // Unblock accept() with a connection to ourselves, then close.
  try {
    tcp::socket poke{state_->io};
    poke.connect(state_->acceptor.local_endpoint(), ec);
  } catch (...) {
  }
  if (thread_.joinable()) thread_.join();
  state_->acceptor.close(ec);
}

}  // namespace tenure::detail
