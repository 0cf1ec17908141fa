// tenure serve [--listen ADDR:PORT] [--read-only] [--token-file FILE] [--statement-timeout D]: the operators' dashboard
// (pages, JSON API, /metrics) in this one process.
#include <sys/stat.h>

#include <charconv>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <boost/asio/ip/address.hpp>

#include "cli/commands.hpp"
#include "cli/time_text.hpp"
#include "serve/app.hpp"
#include "serve/server.hpp"

namespace tenure::cli {
namespace {

struct serve_options {
  std::string listen = "127.0.0.1:8080";
  bool read_only = false;
  std::string token_file;
  std::string statement_timeout = "10s";
};

/// `host:port`, `[v6]:port`; the port may be 0 (any free one, printed at start).
std::pair<std::string, std::uint16_t> parse_listen(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) throw command_error("--listen " + text + ": expected ADDRESS:PORT", k_exit_usage);
  std::string host = text.substr(0, colon);
  const std::string port_text = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc{} || end != port_text.data() + port_text.size() || port > 65535) {
    throw command_error("--listen " + text + ": the port must be a number from 0 to 65535", k_exit_usage);
  }
  boost::system::error_code bad;
  boost::asio::ip::make_address(host, bad);
  if (bad) throw command_error("--listen " + text + ": '" + host + "' is not an IP address", k_exit_usage);
  return {host, static_cast<std::uint16_t>(port)};
}

/// The bearer token: the file's content without surrounding white space. The file must be the
/// owner's alone (a token others can read is no secret).
std::string read_token(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw command_error("--token-file " + path + ": cannot read it", k_exit_usage);
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    throw command_error("--token-file " + path + " is readable or writable by group or others: chmod 600 it",
                        k_exit_usage);
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw command_error("--token-file " + path + ": cannot read it", k_exit_usage);
  std::string token = text.str();
  const auto first = token.find_first_not_of(" \t\r\n");
  const auto last = token.find_last_not_of(" \t\r\n");
  token = first == std::string::npos ? "" : token.substr(first, last - first + 1);
  if (token.size() < 16) {
    throw command_error("--token-file " + path + ": the token must be at least 16 characters", k_exit_usage);
  }
  if (token.find_first_of(" \t\r\n") != std::string::npos) {
    throw command_error("--token-file " + path + ": the token must be one line without spaces", k_exit_usage);
  }
  return token;
}

bool loopback(const std::string& host) {
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(host, ec);
  return !ec && addr.is_loopback();
}

int run_serve(const context& ctx, const serve_options& o) {
  const auto [host, port] = parse_listen(o.listen);
  serve::app_config config;
  config.dsn = ctx.dsn();
  config.schema = ctx.schema;
  if (!o.read_only && !o.token_file.empty()) config.token = read_token(o.token_file);
  config.loopback_hosts_only = loopback(host);
  const auto limit = parse_duration(o.statement_timeout);
  if (!limit || *limit < std::chrono::milliseconds{1}) {
    throw command_error("--statement-timeout " + o.statement_timeout + ": expected a duration of at least 1ms",
                        k_exit_usage);
  }
  config.statement_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(*limit);

  postgres::store_options options;
  options.dsn = config.dsn;
  options.schema = ctx.schema;
  options.pool_size = 2;
  options.application_name = "tenure-serve";
  options.pool_mode = postgres::pool_mode::transaction;  // nothing left on a session: poolers welcome
  auto opened = postgres::store::open(std::move(options));
  if (!opened) throw adapter_error("", opened.error());
  serve::app app(std::move(config), std::move(opened).value());

  std::unique_ptr<serve::server> srv;
  try {
    srv = std::make_unique<serve::server>(
        host, port, serve::server_limits{}, [&app](const serve::request& req) { return app.handle(req); },
        [&app](unsigned status) { app.refused(status); });
  } catch (const std::exception& e) {
    throw command_error(e.what());
  }
  if (!loopback(host)) {
    print_failure("warning: listening on " + host + ", not a loopback address: anyone who reaches it can read jobs");
  }
  const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::cout << "tenure serve: http://" << shown << ":" << srv->port() << "/ schema " << ctx.schema << ", actions "
            << (app.actions_enabled() ? "on (bearer token)" : o.read_only ? "off (--read-only)" : "off (no --token-file)")
            << std::endl;
  srv->run();
  return k_exit_ok;
}

}  // namespace

void register_serve(CLI::App& app, context& ctx) {
  auto o = std::make_shared<serve_options>();
  auto* cmd = app.add_subcommand("serve", "Serve the operators' dashboard and JSON API over HTTP (until SIGINT/SIGTERM)");
  cmd->add_option("--listen", o->listen, "ADDRESS:PORT to listen on (port 0: any free port)")->capture_default_str();
  cmd->add_flag("--read-only", o->read_only, "Turn actions (retry, cancel, pause, resume) off");
  cmd->add_option("--token-file", o->token_file,
                  "File holding the bearer token that actions need (mode 600); without it actions are off");
  cmd->add_option("--statement-timeout", o->statement_timeout,
                  "Longest a dashboard query may run on the server (lock waits included); past it the answer is a 500")
      ->type_name("D")
      ->check(check_duration, "D")
      ->capture_default_str();
  cmd->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_serve(ctx, *o); }; });
}

}  // namespace tenure::cli
