#include "http.hpp"

#include <array>
#include <charconv>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <spdlog/spdlog.h>

namespace billing {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

response json_response(http::status status, const nlohmann::json& body) {
  response res{status, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = body.dump() + "\n";
  return res;
}

response error_response(http::status status, std::string_view message) {
  return json_response(status, {{"error", message}});
}

response text_response(http::status status, std::string body, std::string_view content_type) {
  response res{status, 11};
  res.set(http::field::content_type, std::string{content_type});
  res.body() = std::move(body);
  return res;
}

std::optional<std::pair<std::string, std::uint16_t>> parse_host_port(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const auto port_text = text.substr(colon + 1);
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || end != port_text.data() + port_text.size() || port > 65535) return std::nullopt;
  return std::pair{std::string{text.substr(0, colon)}, static_cast<std::uint16_t>(port)};
}

// ---- server -----------------------------------------------------------------------------------

struct http_server::state {
  state(options o, handler h) : opts(std::move(o)), fn(std::move(h)), pool(static_cast<std::size_t>(opts.handler_threads)) {}
  options opts;
  handler fn;
  asio::thread_pool pool;  // runs handlers
  std::string url;
  std::atomic<bool> stopped{false};
  std::thread io_thread;
  // Declared last so that it is destroyed first: pending operations own the sessions, and the
  // sessions use the members above.
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_timer{io};  ///< the pause after a failed accept
  bool accept_paused = false;           ///< touched on the I/O thread only
};

namespace {

constexpr std::chrono::milliseconds k_accept_pause{100};

bool is_protocol_error(const beast::error_code& ec) {
  return ec.category() == beast::http::make_error_code(http::error::bad_target).category();
}

/// One client connection: read a request, hand it to the pool, write the answer, repeat while
/// the client keeps the connection alive. Touched on the I/O thread only.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, http_server::state& st) : stream_(std::move(socket)), st_(st) {}

  void read() {
    parser_.emplace();
    parser_->body_limit(st_.opts.max_body);
    parser_->header_limit(16 * 1024);
    stream_.expires_after(st_.opts.io_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      spdlog::warn("{}: refused a request body over {} bytes", st_.opts.name, st_.opts.max_body);
      return write(error_response(http::status::payload_too_large,
                                  "request body is larger than " + std::to_string(st_.opts.max_body) + " bytes"),
                   /*keep_alive=*/false);
    }
    if (ec && is_protocol_error(ec) && ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return write(error_response(http::status::bad_request, "malformed HTTP request: " + ec.message()), false);
    }
    if (ec) return close();  // end of stream, timeout, reset: nothing to answer
    auto req = parser_->release();
    const bool keep_alive = req.keep_alive();
    stream_.expires_never();  // the handler may take a while (provider delay); the write re-arms it
    asio::post(st_.pool, [self = shared_from_this(), req = std::move(req), keep_alive]() mutable {
      response res;
      try {
        res = self->st_.fn(req);
      } catch (const std::exception& e) {
        spdlog::error("{}: {} {} failed: {}", self->st_.opts.name, std::string{req.method_string()},
                      std::string{req.target()}, e.what());
        res = error_response(http::status::internal_server_error, "internal error");
      }
      asio::post(self->stream_.get_executor(), [self, res = std::move(res), keep_alive]() mutable {
        self->write(std::move(res), keep_alive);
      });
    });
  }

  void write(response res, bool keep_alive) {
    res.keep_alive(keep_alive);
    res.set(http::field::server, "billing_inbox");
    res.prepare_payload();
    auto msg = std::make_shared<response>(std::move(res));
    stream_.expires_after(st_.opts.io_timeout);
    http::async_write(stream_, *msg, [self = shared_from_this(), msg, keep_alive](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      if (keep_alive) return self->read();
      self->finish();
    });
  }

  /// After the last response: stop sending, then read and discard what the client still sends
  /// (e.g. the rest of an oversized body) until it closes, so that closing does not reset the
  /// connection before the client has read the answer.
  void finish() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds{2});
    drain();
  }
  void drain() {
    stream_.async_read_some(asio::buffer(sink_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }
  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  http_server::state& st_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> sink_{};
};

void accept_loop(http_server::state& st) {
  st.acceptor.async_accept(asio::make_strand(st.io), [&st](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !st.acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors (EMFILE), out of memory, ...: the pending connection stays in
      // the backlog, so accepting again at once would fail again at once, spinning a core.
      // Pause instead, and say so once per episode (the pause repeats while the cause lasts).
      if (!st.accept_paused) {
        spdlog::warn("{}: cannot accept connections ({}); pausing accepts for {} ms at a time until it clears",
                     st.opts.name, ec.message(), k_accept_pause.count());
      }
      st.accept_paused = true;
      st.accept_timer.expires_after(k_accept_pause);
      st.accept_timer.async_wait([&st](beast::error_code wait_ec) {
        if (!wait_ec) accept_loop(st);
      });
      return;
    }
    if (st.accept_paused) spdlog::info("{}: accepting connections again", st.opts.name);
    st.accept_paused = false;
    std::make_shared<session>(std::move(socket), st)->read();
    accept_loop(st);
  });
}

}  // namespace

http_server::http_server(options opts, handler fn) : st_(std::make_unique<state>(std::move(opts), std::move(fn))) {}

http_server::~http_server() { stop(); }

bool http_server::start(const std::string& host, std::uint16_t port, std::string* error) {
  beast::error_code ec;
  const auto addr = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    if (error) *error = "bad listen address '" + host + "': " + ec.message();
    return false;
  }
  const tcp::endpoint ep{addr, port};
  st_->acceptor.open(ep.protocol(), ec);
  if (!ec) st_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) st_->acceptor.bind(ep, ec);
  if (!ec) st_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    if (error) *error = "cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message();
    return false;
  }
  const auto bound = st_->acceptor.local_endpoint();
  st_->url = "http://" + bound.address().to_string() + ":" + std::to_string(bound.port());
  accept_loop(*st_);
  st_->io_thread = std::thread([st = st_.get()] { st->io.run(); });
  return true;
}

std::string http_server::url() const { return st_->url; }

void http_server::stop() noexcept {
  if (!st_ || st_->stopped.exchange(true)) return;
  if (!st_->io_thread.joinable()) return;
  try {
    asio::post(st_->io, [st = st_.get()] {
      beast::error_code ec;
      st->acceptor.close(ec);
      st->accept_timer.cancel();
    });
    st_->pool.join();  // requests being handled finish and post their answers
    // Give answers posted by the pool a moment to be written before the loop stops.
    asio::post(st_->io, [st = st_.get()] { st->io.stop(); });
    st_->io_thread.join();
  } catch (const std::exception& e) {
    spdlog::error("{}: stop: {}", st_->opts.name, e.what());
  }
}

// ---- client -----------------------------------------------------------------------------------

std::optional<http_reply> http_call(std::string_view url, http::verb method, std::string body,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    std::chrono::milliseconds timeout, std::string* error) {
  constexpr std::string_view scheme = "http://";
  if (url.substr(0, scheme.size()) != scheme) {
    if (error) *error = "only http:// URLs are supported: " + std::string{url};
    return std::nullopt;
  }
  auto rest = url.substr(scheme.size());
  const auto slash = rest.find('/');
  const std::string target = slash == std::string_view::npos ? "/" : std::string{rest.substr(slash)};
  const auto hp = parse_host_port(rest.substr(0, slash));
  if (!hp) {
    if (error) *error = "URL needs host:port: " + std::string{url};
    return std::nullopt;
  }

  asio::io_context io;
  tcp::resolver resolver{io};
  beast::tcp_stream stream{io};
  beast::flat_buffer buffer;
  request req{method, target, 11};
  req.set(http::field::host, std::string{rest.substr(0, slash)});
  req.set(http::field::user_agent, "billing_inbox");
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  for (const auto& [name, value] : headers) req.set(name, value);
  req.body() = std::move(body);
  req.keep_alive(false);
  req.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.body_limit(8 * 1024 * 1024);

  beast::error_code result;
  const char* step = "resolve";
  stream.expires_after(timeout);
  resolver.async_resolve(hp->first, std::to_string(hp->second), [&](beast::error_code ec, tcp::resolver::results_type eps) {
    if (ec) return void(result = ec);
    step = "connect";
    stream.async_connect(eps, [&](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return void(result = ec);
      step = "send";
      http::async_write(stream, req, [&](beast::error_code ec, std::size_t) {
        if (ec) return void(result = ec);
        step = "read the response";
        http::async_read(stream, buffer, parser, [&](beast::error_code ec, std::size_t) { result = ec; });
      });
    });
  });
  io.run_for(timeout + std::chrono::seconds{1});  // the stream's deadline ends every step but resolve
  if (!io.stopped()) result = beast::error::timeout;
  if (result || !parser.is_done()) {
    if (error) *error = std::string{step} + " " + std::string{url} + ": " + (result ? result.message() : "incomplete response");
    return std::nullopt;
  }
  auto res = parser.release();
  return http_reply{static_cast<int>(res.result_int()), std::move(res.body()), std::string{res[http::field::content_type]}};
}

}  // namespace billing
