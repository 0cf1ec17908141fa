#include "serve/server.hpp"

#include <atomic>
#include <optional>
#include <stdexcept>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>

#include <spdlog/spdlog.h>

namespace tenure::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

namespace {
/// After a failed accept (e.g. out of file descriptors) the next one waits this long.
constexpr std::chrono::milliseconds k_accept_pause{100};
}  // namespace

struct server::state {
  server_limits limits;
  handler_fn handler;
  refusal_fn on_refusal;
  // Touched on the I/O thread only.
  int connections = 0;
  bool accept_paused = false;
  // Handlers run here; declared before `io` so it is destroyed after it (join() first, in run()).
  asio::thread_pool pool;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_timer{io};
  asio::signal_set signals{io, SIGINT, SIGTERM};

  explicit state(server_limits l) : limits(l), pool(static_cast<std::size_t>(l.handler_threads)) {}
};

namespace {

/// One connection: requests are read with a deadline, handled on the pool, answered in order.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, server::state& st) : stream_(std::move(socket)), st_(st) { ++st_.connections; }
  ~session() { --st_.connections; }

  void read(std::chrono::seconds first_byte_timeout) {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(st_.limits.header_limit));
    parser_->body_limit(st_.limits.body_limit);
    // One deadline for the whole request: a client trickling bytes cannot hold the connection.
    stream_.expires_after(first_byte_timeout);
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      self->on_read(ec);
    });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == asio::error::eof) {
      return close();
    }
    if (ec) {
      // The server's own answers: too large, or not HTTP. The connection closes after them.
      unsigned status = 400;
      if (ec == http::error::header_limit) status = 431;
      if (ec == http::error::body_limit) status = 413;
      return refuse(status);
    }
    auto req = std::make_shared<request>(parser_->release());
    asio::post(st_.pool, [self = shared_from_this(), req] {
      auto res = std::make_shared<response>(self->st_.handler(*req));
      res->version(req->version());
      res->keep_alive(req->keep_alive());
      res->prepare_payload();
      asio::post(self->stream_.get_executor(), [self, res] { self->write(res); });
    });
  }

  void refuse(unsigned status) {
    if (st_.on_refusal) st_.on_refusal(status);
    auto res = std::make_shared<response>(static_cast<http::status>(status), 11);
    res->set(http::field::content_type, "application/json");
    res->set("X-Content-Type-Options", "nosniff");
    res->set(http::field::connection, "close");
    res->body() = status == 431   ? R"({"error":"request headers too large"})"
                  : status == 413 ? R"({"error":"request body too large"})"
                                  : R"({"error":"bad request"})";
    res->body() += "\n";
    res->keep_alive(false);
    res->prepare_payload();
    write(res);
  }

  void write(const std::shared_ptr<response>& res) {
    stream_.expires_after(st_.limits.io_timeout);
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
      if (ec || !res->keep_alive()) return self->close();
      self->read(self->st_.limits.idle_timeout);
    });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  server::state& st_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
};

void accept_loop(server::state* st) {
  st->acceptor.async_accept([st](beast::error_code ec, tcp::socket socket) {
    if (!st->acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors (EMFILE), ...: the pending connection stays queued, so accepting
      // again at once would fail at once, spinning a core. Pause; say so once per episode.
      if (!st->accept_paused) {
        spdlog::warn("tenure serve: cannot accept connections ({}); pausing accepts for {} ms at a time",
                     ec.message(), k_accept_pause.count());
      }
      st->accept_paused = true;
      st->accept_timer.expires_after(k_accept_pause);
      st->accept_timer.async_wait([st](beast::error_code wait_ec) {
        if (!wait_ec) accept_loop(st);
      });
      return;
    }
    st->accept_paused = false;
    if (st->connections >= st->limits.max_connections) {
      beast::error_code ignored;
      socket.close(ignored);  // refuse rather than queue: the clients already in keep being served
    } else {
      std::make_shared<session>(std::move(socket), *st)->read(st->limits.io_timeout);
    }
    accept_loop(st);
  });
}

}  // namespace

server::server(const std::string& address, std::uint16_t port, server_limits limits, handler_fn handler,
               refusal_fn on_refusal)
    : state_(std::make_shared<state>(limits)) {
  state_->handler = std::move(handler);
  state_->on_refusal = std::move(on_refusal);
  beast::error_code ec;
  const auto addr = asio::ip::make_address(address, ec);
  if (ec) throw std::runtime_error("'" + address + "' is not an IP address");
  const tcp::endpoint ep{addr, port};
  auto& acceptor = state_->acceptor;
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + address + ":" + std::to_string(port) + ": " + ec.message());
}

server::~server() {
  state_->pool.stop();
  state_->pool.join();
}

std::uint16_t server::port() const noexcept {
  beast::error_code ec;
  return state_->acceptor.local_endpoint(ec).port();
}

void server::run() {
  auto* st = state_.get();
  st->signals.async_wait([st](beast::error_code, int) {
    beast::error_code ignored;
    st->acceptor.close(ignored);
    st->io.stop();
  });
  accept_loop(st);
  st->io.run();
  // Handlers still running post their answers to a stopped loop; they are dropped with it.
  st->pool.stop();
  st->pool.join();
}

}  // namespace tenure::serve
