#pragma once
/// \file
/// A loopback TCP proxy in front of PostgreSQL that injects network faults for tests.
///
/// It listens on 127.0.0.1 (port chosen by the OS), connects each accepted client to the
/// upstream server and forwards bytes both ways from one background thread (non-blocking sockets
/// and poll). The client's stream is parsed as PostgreSQL v3 frontend protocol, the server's as
/// backend messages, so that the proxy knows which reply belongs to which request.
///
/// The main fault is the lost COMMIT acknowledgement: when armed, the next COMMIT a client sends
/// is forwarded, the proxy waits until the server's full reply to it (up to its ReadyForQuery)
/// has arrived, discards that reply and resets the client connection. The server committed; the
/// client saw a broken connection. Streams must be plain: dsn() forces sslmode=disable and
/// gssencmode=disable (an encrypted stream is forwarded blind and never faulted).
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace tenure::test {

class fault_proxy {
 public:
  /// Proxies to host:port (resolved once, here). Throws std::runtime_error on failure.
  fault_proxy(const std::string& upstream_host, std::uint16_t upstream_port);
  /// Proxies to the TCP server a libpq DSN (URL or keyword form) names.
  explicit fault_proxy(const std::string& upstream_dsn);
  /// Stops the thread and closes every socket.
  ~fault_proxy();
  fault_proxy(const fault_proxy&) = delete;
  fault_proxy& operator=(const fault_proxy&) = delete;

  /// The host and port of a libpq DSN; throws unless it names exactly one TCP host.
  static std::pair<std::string, std::uint16_t> upstream_of(const std::string& dsn);
  /// True for COMMIT or END, optionally WORK/TRANSACTION and a semicolon; trimmed, any case.
  static bool is_commit_statement(std::string_view sql);

  /// The port the proxy listens on (on 127.0.0.1).
  std::uint16_t port() const noexcept { return port_; }
  /// `dsn` rewritten (keyword form) to connect through this proxy, with SSL and GSS encryption off.
  std::string dsn(const std::string& dsn) const;

  /// Arms the lost-COMMIT-reply fault for the next `times` COMMITs (across all connections).
  void arm_drop_commit_reply(int times = 1) noexcept;
  /// Disarms it: COMMITs not yet intercepted pass normally.
  void disarm() noexcept { armed_.store(0); }
  /// How many more COMMITs will be intercepted.
  int armed() const noexcept { return armed_.load(); }
  /// How many times a COMMIT reply was dropped (counted once the server's reply had arrived,
  /// before the client's connection is reset).
  int fired() const noexcept { return fired_.load(); }

  /// Resets every proxied connection now (both sides); returns how many there were.
  std::size_t kill_all();
  /// Black-holes every proxied connection now: the server side is closed (so the server ends
  /// those sessions and releases their locks), while each client's socket stays open and is
  /// never read or answered again, as when a network path drops without a word. Returns how
  /// many there were.
  std::size_t black_hole_all();
  /// While on, new connections are accepted and then never answered (a silent host).
  void silence(bool on) noexcept { silence_.store(on); }
  /// Resets every connection kill_all() would, and also every client socket black_hole_all()
  /// or silence() left open: whatever still waits on this proxy gets an error now.
  std::size_t kill_everything();
  /// While on, new connections are accepted and closed at once (existing ones keep working).
  void refuse(bool on) noexcept { refuse_.store(on); }
  /// Proxied connections currently open.
  std::size_t connections() const noexcept { return live_.load(); }
  /// Connections accepted and proxied so far (refused ones not counted).
  std::size_t accepted() const noexcept { return accepted_.load(); }

 private:
  struct session;
  explicit fault_proxy(const std::pair<std::string, std::uint16_t>& upstream);
  void run();
  void wake() noexcept;
  bool take_arm() noexcept;
  bool on_client_message(session& s);
  std::size_t on_client_bytes(session& s, const char* p, std::size_t n);
  int on_server_bytes(session& s, const char* p, std::size_t n);
  void service(session& s, short client_events, short server_events);
  void accept_all();

  int listen_fd_ = -1;
  int wake_rd_ = -1;
  int wake_wr_ = -1;
  std::uint16_t port_ = 0;
  alignas(16) unsigned char upstream_addr_[128] = {};  // the resolved upstream sockaddr
  std::uint32_t upstream_addr_len_ = 0;

  std::atomic<int> armed_{0};
  std::atomic<int> fired_{0};
  std::atomic<bool> refuse_{false};
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> live_{0};
  std::atomic<std::size_t> accepted_{0};

  // kill_all() hands its request to the proxy thread and waits for the answer.
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t kill_requested_ = 0;
  std::uint64_t kill_done_ = 0;
  std::size_t last_killed_ = 0;
  bool kill_silently_ = false;  // the pending kill is a black_hole_all()
  bool kill_silent_too_ = false;  // the pending kill is a kill_everything()
  std::atomic<bool> silence_{false};
  std::vector<int> silent_;  // client sockets kept open and never served (proxy thread only)

  std::list<session> sessions_;  // touched by the proxy thread only
  std::thread thread_;
};

}  // namespace tenure::test
