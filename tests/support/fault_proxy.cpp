#include "support/fault_proxy.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace tenure::test {
namespace {

constexpr std::size_t k_chunk = 64 * 1024;         // bytes read per readable event
constexpr std::size_t k_queue_cap = 256 * 1024;    // stop reading a side while its queue is fuller
constexpr std::size_t k_keep_body = 4096;          // body bytes kept for inspection (COMMIT is short)

// Codes of the untyped startup-phase packets (the int32 after the length).
constexpr std::uint32_t k_cancel_request = 80877102;
constexpr std::uint32_t k_ssl_request = 80877103;
constexpr std::uint32_t k_gssenc_request = 80877104;

std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error("fault_proxy: " + what + ": " + std::strerror(errno));
}

std::uint32_t be32(const unsigned char* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | p[3];
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Closes with a TCP RST instead of an orderly FIN: the peer sees "connection reset".
void close_abruptly(int fd) {
  if (fd < 0) return;
  linger l{};
  l.l_onoff = 1;
  l.l_linger = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

// Splits a protocol byte stream into messages, incrementally. A message is a header -- one type
// byte (absent for the untyped startup-phase packets) and a big-endian int32 length that counts
// itself but not the type byte -- and a body. The first k_keep_body body bytes are kept.
struct framer {
  explicit framer(bool typed_from_start) : typed(typed_from_start) {}

  bool typed;
  bool bad = false;         // an impossible length: the stream cannot be parsed any further
  bool truncated = false;   // the body was longer than what is kept
  std::string body;

  char type() const noexcept { return typed ? static_cast<char>(header_[0]) : '\0'; }
  bool at_boundary() const noexcept { return have_ == 0 && !in_body_; }

  // Consumes p[0..n) up to the end of at most one message; sets `done` when one ended.
  std::size_t step(const char* p, std::size_t n, bool& done) {
    done = false;
    std::size_t used = 0;
    if (!in_body_) {
      const std::size_t header_len = typed ? 5 : 4;
      while (have_ < header_len && used < n) header_[have_++] = static_cast<unsigned char>(p[used++]);
      if (have_ < header_len) return used;
      const std::uint32_t len = be32(header_ + header_len - 4);
      if (len < (typed ? 4u : 8u)) {
        bad = true;
        return used;
      }
      left_ = len - 4;
      in_body_ = true;
      body.clear();
      truncated = false;
    }
    const std::size_t take = std::min(left_, n - used);
    const std::size_t keep = std::min(take, k_keep_body - body.size());
    body.append(p + used, keep);
    truncated = truncated || keep < take;
    used += take;
    left_ -= take;
    if (left_ == 0) {
      done = true;
      in_body_ = false;
      have_ = 0;
    }
    return used;
  }

 private:
  unsigned char header_[5] = {};
  std::size_t have_ = 0;   // header bytes collected
  std::size_t left_ = 0;   // body bytes still to come
  bool in_body_ = false;
};

// The NUL-terminated string at body[pos]; advances pos past it. `ok` turns false if no NUL.
std::string cstring(const std::string& body, std::size_t& pos, bool& ok) {
  const auto end = pos < body.size() ? body.find('\0', pos) : std::string::npos;
  if (end == std::string::npos) {
    ok = false;
    pos = body.size();
    return {};
  }
  std::string s = body.substr(pos, end - pos);
  pos = end + 1;
  return s;
}

std::string quote_value(const std::string& v) {
  std::string q = "'";
  for (char c : v) {
    if (c == '\'' || c == '\\') q += '\\';
    q += c;
  }
  return q + "'";
}

struct conninfo_deleter {
  void operator()(PQconninfoOption* o) const noexcept { PQconninfoFree(o); }
};

std::unique_ptr<PQconninfoOption, conninfo_deleter> parse_dsn(const std::string& dsn) {
  char* err = nullptr;
  std::unique_ptr<PQconninfoOption, conninfo_deleter> opts{PQconninfoParse(dsn.c_str(), &err)};
  if (!opts) {
    std::string msg = err ? err : "out of memory";
    PQfreemem(err);
    throw std::runtime_error("fault_proxy: bad DSN: " + msg);
  }
  return opts;
}

}  // namespace

// One proxied connection: the two sockets, the bytes queued for each, and protocol state.
struct fault_proxy::session {
  int client = -1;
  int server = -1;
  bool connecting = true;    // the upstream connect() has not finished yet
  std::string to_server;     // queued, not yet written
  std::string to_client;
  bool client_eof = false;
  bool server_eof = false;
  bool dead = false;         // close both sides (orderly) at the end of this round
  bool opaque = false;       // not parsed any more (encrypted or malformed): forwarded blind

  framer front{false};  // client -> server, starts with the untyped startup packet
  framer back{true};    // server -> client
  int one_byte_replies = 0;      // SSLRequest/GSSENCRequest answers ('N') the server still owes
  std::uint64_t z_expected = 0;  // ReadyForQuery messages the client's requests will produce
  std::uint64_t z_seen = 0;      // ReadyForQuery messages received from the server
  std::map<std::string, bool> statements;  // extended protocol: prepared statement -> is COMMIT
  std::map<std::string, bool> portals;     // portal -> is COMMIT
  bool commit_before_sync = false;         // an Execute of a COMMIT since the last Sync

  bool dropping = false;         // the fault fired: the client stream was cut after a COMMIT
  std::uint64_t drop_at_z = 0;   // the ReadyForQuery that ends that COMMIT's reply
};

fault_proxy::fault_proxy(const std::string& upstream_dsn) : fault_proxy(upstream_of(upstream_dsn)) {}

fault_proxy::fault_proxy(const std::pair<std::string, std::uint16_t>& upstream)
    : fault_proxy(upstream.first, upstream.second) {}

fault_proxy::fault_proxy(const std::string& upstream_host, std::uint16_t upstream_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(upstream_host.c_str(), std::to_string(upstream_port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw std::runtime_error("fault_proxy: cannot resolve " + upstream_host + ": " + ::gai_strerror(rc));
  }
  static_assert(sizeof upstream_addr_ >= sizeof(sockaddr_storage));
  std::memcpy(upstream_addr_, found->ai_addr, found->ai_addrlen);
  upstream_addr_len_ = found->ai_addrlen;
  ::freeaddrinfo(found);

  auto fail = [this](const std::string& what) {
    auto e = sys_error(what);
    for (int fd : {listen_fd_, wake_rd_, wake_wr_}) {
      if (fd >= 0) ::close(fd);
    }
    return e;
  };
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw fail("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // the OS picks
  socklen_t len = sizeof addr;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throw fail("bind");
  if (::listen(listen_fd_, 128) != 0) throw fail("listen");
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) throw fail("getsockname");
  port_ = ntohs(addr.sin_port);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) throw fail("pipe");
  wake_rd_ = pipe_fds[0];
  wake_wr_ = pipe_fds[1];
  thread_ = std::thread([this] { run(); });
}

fault_proxy::~fault_proxy() {
  stop_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
  for (auto& s : sessions_) {
    close_abruptly(s.client);
    ::close(s.server);
  }
  for (int c : silent_) ::close(c);
  ::close(listen_fd_);
  ::close(wake_rd_);
  ::close(wake_wr_);
}

std::pair<std::string, std::uint16_t> fault_proxy::upstream_of(const std::string& dsn) {
  auto opts = parse_dsn(dsn);
  std::string host, hostaddr, port;
  for (auto* o = opts.get(); o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const std::string key = o->keyword;
    if (key == "host") host = o->val;
    if (key == "hostaddr") hostaddr = o->val;
    if (key == "port") port = o->val;
  }
  if (!hostaddr.empty()) host = hostaddr;
  if (host.empty() || host.front() == '/' || host.front() == '@' || host.find(',') != std::string::npos) {
    throw std::runtime_error("fault_proxy: the DSN must name one TCP host: " + dsn);
  }
  if (port.empty()) return {host, 5432};
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    throw std::runtime_error("fault_proxy: bad port in DSN: " + port);
  }
  return {host, static_cast<std::uint16_t>(std::stoi(port))};
}

bool fault_proxy::is_commit_statement(std::string_view sql) {
  std::string s;
  for (char c : sql) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  if (!s.empty() && s.back() == ';') s.pop_back();
  std::istringstream words{s};
  std::string first, second, extra;
  words >> first >> second >> extra;
  return (first == "commit" || first == "end") && (second.empty() || second == "work" || second == "transaction") &&
         extra.empty();
}

std::string fault_proxy::dsn(const std::string& dsn) const {
  auto opts = parse_dsn(dsn);
  std::string out;
  for (auto* o = opts.get(); o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const std::string key = o->keyword;
    if (key == "host" || key == "hostaddr" || key == "port" || key == "sslmode" || key == "gssencmode" ||
        key == "requiressl") {
      continue;
    }
    out += key + "=" + quote_value(o->val) + " ";
  }
  return out + "host=127.0.0.1 port=" + std::to_string(port_) + " sslmode=disable gssencmode=disable";
}

void fault_proxy::arm_drop_commit_reply(int times) noexcept {
  if (times > 0) armed_.fetch_add(times);
}

// Takes one arming, if any is left.
bool fault_proxy::take_arm() noexcept {
  int n = armed_.load();
  while (n > 0 && !armed_.compare_exchange_weak(n, n - 1)) {
  }
  return n > 0;
}

std::size_t fault_proxy::black_hole_all() {
  {
    std::lock_guard lock{mu_};
    kill_silently_ = true;
  }
  return kill_all();
}

std::size_t fault_proxy::kill_everything() {
  {
    std::lock_guard lock{mu_};
    kill_silent_too_ = true;
  }
  return kill_all();
}

std::size_t fault_proxy::kill_all() {
  std::unique_lock lock{mu_};
  const auto ticket = ++kill_requested_;
  wake();
  cv_.wait(lock, [&] { return kill_done_ >= ticket || stop_.load(); });
  return last_killed_;
}

void fault_proxy::wake() noexcept {
  const char b = 1;
  [[maybe_unused]] auto n = ::write(wake_wr_, &b, 1);  // a full pipe already wakes the thread
}

// One complete client message (in s.front). Tracks which requests produce a ReadyForQuery and
// which run COMMIT; returns true when the fault fires on this message (nothing after it may go
// upstream). Simple protocol: 'Q' carries the SQL. Extended protocol: Parse ('P') names a
// statement and its SQL, Bind ('B') makes a portal of a statement, Execute ('E') runs a portal,
// Sync ('S') ends the batch and is answered by ReadyForQuery; Close ('C') drops either.
bool fault_proxy::on_client_message(session& s) {
  const std::string& b = s.front.body;
  if (!s.front.typed) {  // startup phase: the int32 after the length says which packet this is
    const std::uint32_t code = b.size() >= 4 ? be32(reinterpret_cast<const unsigned char*>(b.data())) : 0;
    if (code == k_ssl_request || code == k_gssenc_request) {
      ++s.one_byte_replies;  // the server answers one byte; another startup packet follows
    } else if (code != k_cancel_request) {
      s.front.typed = true;  // StartupMessage: typed messages follow; login ends with ReadyForQuery
      ++s.z_expected;
    }
    return false;
  }
  std::size_t pos = 0;
  bool ok = !s.front.truncated;
  switch (s.front.type()) {
    case 'Q': {
      ++s.z_expected;
      const std::string sql = cstring(b, pos, ok);
      if (ok && is_commit_statement(sql) && take_arm()) {
        s.dropping = true;
        s.drop_at_z = s.z_expected;
        return true;
      }
      return false;
    }
    case 'P': {
      const std::string name = cstring(b, pos, ok);
      const std::string sql = cstring(b, pos, ok);
      s.statements[name] = ok && is_commit_statement(sql);
      return false;
    }
    case 'B': {
      const std::string portal = cstring(b, pos, ok);
      const std::string statement = cstring(b, pos, ok);
      const auto it = s.statements.find(statement);
      s.portals[portal] = it != s.statements.end() && it->second;
      return false;
    }
    case 'E': {
      const auto it = s.portals.find(cstring(b, pos, ok));
      if (it != s.portals.end() && it->second) s.commit_before_sync = true;
      return false;
    }
    case 'C': {
      if (b.empty()) return false;
      pos = 1;
      const std::string name = cstring(b, pos, ok);
      (b[0] == 'S' ? s.statements : s.portals).erase(name);
      return false;
    }
    case 'F':  // FunctionCall: answered like a simple query, ReadyForQuery last
      ++s.z_expected;
      return false;
    case 'S':
      ++s.z_expected;
      if (std::exchange(s.commit_before_sync, false) && take_arm()) {
        s.dropping = true;
        s.drop_at_z = s.z_expected;
        return true;
      }
      return false;
    default:
      return false;
  }
}

// Parses bytes read from the client; returns how many of them go upstream (fewer when the
// fault fired on a message inside them).
std::size_t fault_proxy::on_client_bytes(session& s, const char* p, std::size_t n) {
  std::size_t off = 0;
  while (off < n && !s.opaque) {
    bool done = false;
    off += s.front.step(p + off, n - off, done);
    if (s.front.bad) s.opaque = true;
    if (done && on_client_message(s)) return off;
  }
  return n;
}

namespace {
enum server_outcome { keep_going = 0, reply_dropped = 1, stream_broken = 2 };

// Writes as much of `queue` to fd as the socket takes now; false on a write error.
bool flush(int fd, std::string& queue) {
  while (!queue.empty()) {
    const ssize_t n = ::send(fd, queue.data(), queue.size(), MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    queue.erase(0, static_cast<std::size_t>(n));
  }
  return true;
}

// Reads once from fd: >0 bytes read, 0 end of stream, -1 error, -2 nothing now.
ssize_t read_some(int fd, char* buf) {
  const ssize_t n = ::recv(fd, buf, k_chunk, 0);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -2 : -1;
  return n;
}

}  // namespace

// Parses bytes read from the server and queues those for the client, except -- once the fault
// fired -- the reply to the intercepted COMMIT: everything after the ReadyForQuery before it.
int fault_proxy::on_server_bytes(session& s, const char* p, std::size_t n) {
  std::size_t off = 0;
  while (off < n) {
    if (s.opaque) {
      if (s.dropping) return stream_broken;  // cannot tell when the COMMIT's reply ends
      s.to_client.append(p + off, n - off);
      return keep_going;
    }
    if (s.one_byte_replies > 0 && s.back.at_boundary()) {
      // Answer to SSLRequest/GSSENCRequest: 'N' keeps the stream plain; anything else we cannot read.
      --s.one_byte_replies;
      if (p[off] != 'N') s.opaque = true;
      s.to_client.push_back(p[off++]);
      continue;
    }
    bool done = false;
    const std::size_t used = s.back.step(p + off, n - off, done);
    if (s.back.bad) s.opaque = true;
    if (!s.dropping || s.z_seen + 1 < s.drop_at_z) s.to_client.append(p + off, used);
    off += used;
    if (done && s.back.type() == 'Z' && ++s.z_seen == s.drop_at_z && s.dropping) return reply_dropped;
  }
  return keep_going;
}

void fault_proxy::accept_all() {
  for (;;) {
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) return;  // EAGAIN (all taken) or a transient error: poll tells us when to retry
    if (refuse_.load()) {
      ::close(c);
      continue;
    }
    if (silence_.load()) {
      silent_.push_back(c);
      continue;
    }
    const auto* addr = reinterpret_cast<const sockaddr*>(upstream_addr_);
    const int sv = ::socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (sv < 0) {
      close_abruptly(c);
      continue;
    }
    set_nodelay(c);
    set_nodelay(sv);
    const int rc = ::connect(sv, addr, upstream_addr_len_);
    if (rc != 0 && errno != EINPROGRESS) {
      close_abruptly(c);
      ::close(sv);
      continue;
    }
    auto& s = sessions_.emplace_back();
    s.client = c;
    s.server = sv;
    s.connecting = rc != 0;
    accepted_.fetch_add(1);
  }
}

// Handles poll events of one session: finish the connect, read, parse, forward.
void fault_proxy::service(session& s, short client_events, short server_events) {
  static thread_local std::vector<char> buf(k_chunk);
  const short readable = POLLIN | POLLHUP | POLLERR;
  if (s.connecting) {
    if (server_events == 0) return;
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(s.server, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      s.dead = true;
      return;
    }
    s.connecting = false;
    server_events = 0;  // that event was the connect's
  }
  // Read a side only when poll was asked to (a hang-up is reported even when it was not).
  if ((client_events & readable) && !s.client_eof && !s.dropping) {
    const ssize_t n = read_some(s.client, buf.data());
    if (n == -1) {
      s.dead = true;
      return;
    }
    if (n == 0) s.client_eof = true;
    if (n > 0) s.to_server.append(buf.data(), on_client_bytes(s, buf.data(), static_cast<std::size_t>(n)));
  }
  if ((server_events & readable) && !s.server_eof) {
    const ssize_t n = read_some(s.server, buf.data());
    if (n == -1) {
      s.dead = true;
      return;
    }
    if (n == 0) s.server_eof = true;
    if (n > 0) {
      const int outcome = on_server_bytes(s, buf.data(), static_cast<std::size_t>(n));
      if (outcome == reply_dropped) fired_.fetch_add(1);
      if (outcome != keep_going) {
        // The COMMIT's reply is in (or unreadable): reset the client, never answer it.
        close_abruptly(s.client);
        s.client = -1;
        s.dead = true;
        return;
      }
    }
  }
  if (!flush(s.client, s.to_client) || !flush(s.server, s.to_server)) {
    s.dead = true;
    return;
  }
  // One side ended: finish writing what it sent to the other, then close.
  if ((s.client_eof && s.to_server.empty()) || (s.server_eof && s.to_client.empty())) s.dead = true;
}

void fault_proxy::run() {
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    {
      std::lock_guard lock{mu_};
      if (kill_done_ != kill_requested_) {
        last_killed_ = sessions_.size();
        for (auto& s : sessions_) {
          if (kill_silently_) {
            silent_.push_back(s.client);
          } else {
            close_abruptly(s.client);
          }
          close_abruptly(s.server);
        }
        kill_silently_ = false;
        if (kill_silent_too_) {
          for (int c : silent_) close_abruptly(c);
          silent_.clear();
          kill_silent_too_ = false;
        }
        sessions_.clear();
        live_.store(0);
        kill_done_ = kill_requested_;
        cv_.notify_all();
      }
    }

    // Ask only for events we will act on; an fd with none is left out (-1), so a hung-up
    // socket we no longer read cannot make poll return at once, over and over.
    fds.clear();
    fds.push_back({wake_rd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& s : sessions_) {
      short ce = 0;
      short se = 0;
      if (!s.connecting && !s.client_eof && !s.dropping && s.to_server.size() < k_queue_cap) ce |= POLLIN;
      if (!s.to_client.empty()) ce |= POLLOUT;
      if (s.connecting) {
        se = POLLOUT;
      } else {
        if (!s.server_eof && (s.dropping || s.to_client.size() < k_queue_cap)) se |= POLLIN;
        if (!s.to_server.empty()) se |= POLLOUT;
      }
      fds.push_back({ce ? s.client : -1, ce, 0});
      fds.push_back({se ? s.server : -1, se, 0});
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR

    if (fds[0].revents != 0) {
      char drain[64];
      while (::read(wake_rd_, drain, sizeof drain) > 0) {
      }
    }
    if (fds[1].revents != 0) accept_all();  // new sessions are polled from the next round
    std::size_t i = 2;
    for (auto& s : sessions_) {
      if (i + 1 >= fds.size()) break;
      service(s, fds[i].revents, fds[i + 1].revents);
      i += 2;
    }
    sessions_.remove_if([](session& s) {
      if (!s.dead) return false;
      if (s.client >= 0) ::close(s.client);
      ::close(s.server);
      return true;
    });
    live_.store(sessions_.size());
  }
  std::lock_guard lock{mu_};
  cv_.notify_all();
}

}  // namespace tenure::test
