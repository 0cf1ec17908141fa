#include "sdk/runtime/metrics_server.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

/// A client gets this long to send its request and to read the answer.
constexpr std::chrono::seconds k_io_timeout{5};
/// After a failed accept (e.g. out of file descriptors) the next one waits this long.
constexpr std::chrono::milliseconds k_accept_pause{100};
/// Scrapers are few: connections over this many are closed at once.
constexpr int k_max_connections = 64;

}  // namespace

struct metrics_server::state {
  render_fn render;
  probe_fn health;
  probe_fn ready;
  std::atomic<bool> stopping{false};
  // Touched on the server thread only (and by sessions destroyed with `io`, declared after).
  int connections = 0;
  bool accept_paused = false;
  // Declared last, destroyed first: pending handlers (and the sessions they own) go with `io`
  // while the members above still exist. Handlers hold a plain pointer to this state, never
  // ownership, so nothing is kept alive by the io_context that owns it.
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_timer{io};
};

namespace {

/// One scrape, asynchronous with a deadline: a client that connects and stays silent (or never
/// reads) holds only its own connection, never the port, and never stop().
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, metrics_server::state& st) : stream_(std::move(socket)), st_(st) { ++st_.connections; }
  ~session() { --st_.connections; }

  void read() {
    parser_.header_limit(8 * 1024);
    parser_.body_limit(8 * 1024);
    stream_.expires_after(k_io_timeout);
    http::async_read(stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (!ec) self->answer(self->parser_.get());
    });
  }

 private:
  void answer(const http::request<http::string_body>& req) {
    auto res = std::make_shared<http::response<http::string_body>>();
    res->version(req.version());
    res->keep_alive(false);
    const bool get = req.method() == http::verb::get;
    if (get && req.target() == "/metrics") {
      res->result(http::status::ok);
      res->set(http::field::content_type, "text/plain; version=0.0.4");
      try {
        res->body() = st_.render();
      } catch (const std::exception& e) {
        tenure::logger()->error("tenure: rendering metrics failed: {}", e.what());
        res->result(http::status::internal_server_error);
        res->body() = "metrics unavailable\n";
      }
    } else if (get && (req.target() == "/healthz" || req.target() == "/readyz")) {
      const auto& probe = req.target() == "/healthz" ? st_.health : st_.ready;
      metrics_server::probe_answer a;
      try {
        if (probe) a = probe();
      } catch (const std::exception& e) {
        a = {false, std::string{"probe failed: "} + e.what()};
      }
      res->result(a.ok ? http::status::ok : http::status::service_unavailable);
      res->set(http::field::content_type, "text/plain");
      res->set(http::field::cache_control, "no-store");
      res->body() = a.reason + "\n";
    } else {
      res->result(http::status::not_found);
      res->set(http::field::content_type, "text/plain");
      res->body() = "not found\n";
    }
    res->prepare_payload();
    stream_.expires_after(k_io_timeout);
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code, std::size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  metrics_server::state& st_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
};

void accept_loop(metrics_server::state* st) {
  st->acceptor.async_accept([st](beast::error_code ec, tcp::socket socket) {
    if (st->stopping.load() || !st->acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors (EMFILE), ...: the pending connection stays queued, so accepting
      // again at once would fail at once, spinning a core. Pause; say so once per episode.
      if (!st->accept_paused) {
        tenure::logger()->warn("tenure: metrics server cannot accept connections ({}); pausing accepts for {} ms at a time",
                     ec.message(), k_accept_pause.count());
      }
      st->accept_paused = true;
      st->accept_timer.expires_after(k_accept_pause);
      st->accept_timer.async_wait([st](beast::error_code wait_ec) {
        if (!wait_ec) accept_loop(st);
      });
      return;
    }
    if (st->accept_paused) tenure::logger()->info("tenure: metrics server accepting connections again");
    st->accept_paused = false;
    if (st->connections >= k_max_connections) {
      beast::error_code ignored;
      socket.close(ignored);  // more scrapers than anyone runs: refuse rather than queue
    } else {
      std::make_shared<session>(std::move(socket), *st)->read();
    }
    accept_loop(st);
  });
}

}  // namespace

result<std::unique_ptr<metrics_server>> metrics_server::start(const std::string& address, std::uint16_t port,
                                                             render_fn render, probe_fn health, probe_fn ready) {
  auto st = std::make_shared<state>();
  st->render = std::move(render);
  st->health = std::move(health);
  st->ready = std::move(ready);
  beast::error_code ec;
  const auto addr = asio::ip::make_address(address, ec);
  if (ec) {
    tenure::logger()->error("tenure: bad metrics address '{}': {}", address, ec.message());
    return errc::invalid_argument;
  }
  const tcp::endpoint ep{addr, port};
  st->acceptor.open(ep.protocol(), ec);
  if (!ec) st->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) st->acceptor.bind(ep, ec);
  if (!ec) st->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    tenure::logger()->error("tenure: cannot serve metrics on {}:{}: {}", address, port, ec.message());
    return errc::invalid_argument;
  }
  std::unique_ptr<metrics_server> server{new metrics_server()};
  server->port_ = st->acceptor.local_endpoint().port();
  server->state_ = st;
  accept_loop(st.get());
  server->thread_ = std::thread([st = st.get()] {
    try {
      st->io.run();
    } catch (const std::exception& e) {
      tenure::logger()->error("tenure: metrics server stopped: {}", e.what());
    }
  });
  tenure::logger()->info("tenure: metrics on http://{}:{}/metrics", address, server->port_);
  return server;
}

metrics_server::~metrics_server() { stop(); }

void metrics_server::stop() noexcept {
  if (!state_ || state_->stopping.exchange(true)) return;
  try {
    // Nothing here waits for a client: the loop stops with whatever connections are open, and
    // they close with the io_context.
    state_->io.stop();
  } catch (...) {
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace tenure::detail
