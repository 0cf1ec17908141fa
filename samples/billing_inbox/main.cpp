// billing_inbox: a small web backend on tenure. One binary, several roles:
//   web       POST /orders writes an order and its charge job in one transaction; GET /orders/{id}
//   worker    runs the jobs: `charge` (caller-owned: provider call, then one transaction that marks
//             the order paid, enqueues receipt_email and completes the job) and `receipt_email`
//   provider  a fake payment provider, idempotent by Idempotency-Key
//   all       the three above in one process
//   client    one HTTP request, printed as "<status> <body>" (the demo's curl)
// See README.md next to this file.
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <pthread.h>
#include <sstream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "app.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/runtime.hpp"
#include "tenure/soci.hpp"

namespace billing {

counters& stats() {
  static counters c;
  return c;
}

std::string counters_text() {
  const auto& c = stats();
  std::ostringstream out;
  const auto counter = [&](const char* name, const char* help, const std::atomic<std::uint64_t>& v) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n" << name << ' ' << v.load() << '\n';
  };
  counter("billing_http_requests_total", "HTTP requests answered by this process", c.http_requests);
  counter("billing_orders_created_total", "orders stored with their charge job", c.orders_created);
  counter("billing_orders_rejected_total", "POST /orders answered with 4xx (nothing written)", c.orders_rejected);
  counter("billing_charges_finalized_total", "charges committed with complete_in_tx", c.charges_finalized);
  counter("billing_charges_stale_total", "charges whose complete_in_tx was rejected as stale (TN001)", c.charges_stale);
  counter("billing_charge_errors_total", "charge attempts that failed and will be retried", c.charge_errors);
  counter("billing_receipts_sent_total", "receipt emails sent", c.receipts_sent);
  counter("billing_provider_charges_total", "provider: new charges", c.provider_charges);
  counter("billing_provider_replays_total", "provider: calls answered from an idempotency key", c.provider_replays);
  return out.str();
}

namespace {

const char* const k_usage = R"(usage: billing_inbox --role web|worker|provider|all|client [options]

common:
  --database-url URL        PostgreSQL (default: $DATABASE_URL)
  --schema NAME             tenure's schema (default: $TENURE_SCHEMA or tenure)
  --app-schema NAME         the sample's tables (default: billing)
  --listen HOST:PORT        this role's HTTP address; port 0 picks a free one
                            (web and all: default 127.0.0.1:8080; provider: 127.0.0.1:8081;
                            worker: none unless given, then /metrics and /healthz only)
  --log-level LEVEL         trace|debug|info|warn|error (default: info)
  --db-statement-timeout-ms N  statement_timeout of the sample's own sessions (default: 10000)
  --db-lock-timeout-ms N    lock_timeout of the sample's own sessions (default: 2000)
web:
  --max-body-bytes N        larger request bodies get 413 (default: 16384)
provider:
  --provider-delay-ms N     answer each charge N ms after recording it (default: 0)
  --provider-listen H:P     role all: the provider's address (default: 127.0.0.1:0)
worker:
  --provider-url URL        the payment provider (required; role all: its own)
  --provider-timeout-ms N   deadline of one provider call (default: 10000)
  --heartbeat-ms N          heartbeat interval (default: 1000)
  --staleness-ms N          rescue attempts silent this long (default: 3 x heartbeat)
  --maintenance on|off      take part in promotion and rescue (default: on)
  --concurrency N           jobs at once (default: 4)
  --worker-name NAME        worker id in tenure and in charge_log (default: billing-worker:PID)
  --commit-delay-ms N       fault injection: wait N ms between the provider's answer and the
                            transaction (default: 0)
client:
  --url URL  [--method GET|POST] [--data BODY] [--timeout-ms N]
             prints "<status> <body>"; exit 0 when a response arrived, 1 otherwise

Each server prints one line "listening http://HOST:PORT" on stdout once it accepts requests
(role all also prints "provider listening http://HOST:PORT"); logs go to stderr.
)";

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "billing_inbox: " << why << "\n\n" << k_usage;
  std::exit(2);
}

long long number(const std::string& flag, const std::string& v, long long min, long long max) {
  try {
    std::size_t used = 0;
    const long long n = std::stoll(v, &used);
    if (used == v.size() && n >= min && n <= max) return n;
  } catch (const std::exception&) {
  }
  usage_error(flag + " needs a number between " + std::to_string(min) + " and " + std::to_string(max) + ", got '" + v + "'");
}

config parse(int argc, char** argv, spdlog::level::level_enum& level) {
  config c;
  if (const char* u = std::getenv("DATABASE_URL")) c.database_url = u;
  if (const char* s = std::getenv("TENURE_SCHEMA"); s && *s) c.schema = s;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "-h" || flag == "--help") {
      std::cout << k_usage;
      std::exit(0);
    }
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      usage_error(flag + " needs a value");
    }
    const auto ms = [&](long long max) { return milliseconds{number(flag, value, 0, max)}; };
    if (flag == "--role") c.role = value;
    else if (flag == "--database-url") c.database_url = value;
    else if (flag == "--schema") c.schema = value;
    else if (flag == "--app-schema") c.app_schema = value;
    else if (flag == "--listen") c.listen = value;
    else if (flag == "--provider-listen") c.provider_listen = value;
    else if (flag == "--provider-url") c.provider_url = value;
    else if (flag == "--provider-delay-ms") c.provider_delay = ms(600'000);
    else if (flag == "--provider-timeout-ms") c.provider_timeout = ms(600'000);
    else if (flag == "--heartbeat-ms") c.heartbeat = milliseconds{number(flag, value, 10, 3'600'000)};
    else if (flag == "--staleness-ms") c.staleness = milliseconds{number(flag, value, 20, 36'000'000)};
    else if (flag == "--maintenance") {
      if (value != "on" && value != "off") usage_error("--maintenance is on or off");
      c.maintenance = value == "on";
    } else if (flag == "--concurrency") c.concurrency = static_cast<int>(number(flag, value, 1, 256));
    else if (flag == "--worker-name") c.worker_name = value;
    else if (flag == "--commit-delay-ms") c.commit_delay = ms(600'000);
    else if (flag == "--db-statement-timeout-ms") c.db_statement_timeout = milliseconds{number(flag, value, 1, 3'600'000)};
    else if (flag == "--db-lock-timeout-ms") c.db_lock_timeout = milliseconds{number(flag, value, 1, 3'600'000)};
    else if (flag == "--max-body-bytes") c.max_body = static_cast<std::size_t>(number(flag, value, 1, 64 << 20));
    else if (flag == "--url") c.url = value;
    else if (flag == "--method") c.method = value;
    else if (flag == "--data") c.data = value;
    else if (flag == "--timeout-ms") c.timeout = milliseconds{number(flag, value, 1, 600'000)};
    else if (flag == "--log-level") {
      level = spdlog::level::from_str(value);
      if (level == spdlog::level::off && value != "off") usage_error("unknown --log-level " + value);
    } else usage_error("unknown option " + flag);
  }
  if (c.role != "web" && c.role != "worker" && c.role != "provider" && c.role != "all" && c.role != "client")
    usage_error(c.role.empty() ? "--role is required" : "unknown role " + c.role);
  if (c.role == "client") {
    if (c.url.empty()) usage_error("--role client needs --url");
    return c;
  }
  if (c.database_url.empty()) usage_error("--database-url (or DATABASE_URL) is required");
  if (!tenure::postgres::valid_schema_name(c.schema)) usage_error("bad --schema " + c.schema);
  if (!tenure::postgres::valid_schema_name(c.app_schema)) usage_error("bad --app-schema " + c.app_schema);
  if (c.listen.empty() && (c.role == "web" || c.role == "all")) c.listen = "127.0.0.1:8080";
  if (c.listen.empty() && c.role == "provider") c.listen = "127.0.0.1:8081";
  if (c.role == "worker" && c.provider_url.empty()) usage_error("--role worker needs --provider-url");
  if (c.staleness && *c.staleness < 2 * c.heartbeat) usage_error("--staleness-ms must be at least 2 x --heartbeat-ms");
  return c;
}

int run_client(const config& c) {
  const auto verb = boost::beast::http::string_to_verb(c.method);
  if (verb == http::verb::unknown) usage_error("unknown --method " + c.method);
  std::string why;
  const auto reply = http_call(c.url, verb, c.data, {}, c.timeout, &why);
  if (!reply) {
    std::cerr << "billing_inbox: " << why << "\n";
    return 1;
  }
  std::string body = reply->body;
  while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
  std::cout << reply->status << ' ' << body << std::endl;
  return 0;
}

/// Starts `server` on `address`, printing "<label>listening <url>"; exits on failure.
void serve(http_server& server, const std::string& address, const std::string& label) {
  const auto hp = parse_host_port(address);
  if (!hp) usage_error("bad address '" + address + "' (want HOST:PORT)");
  std::string why;
  if (!server.start(hp->first, hp->second, &why)) {
    spdlog::critical("{}", why);
    std::exit(1);
  }
  std::cout << label << "listening " << server.url() << std::endl;
  spdlog::info("{}listening on {}", label, server.url());
}

int run(config cfg) {
  std::string why;
  const auto connect = tenure::soci_connect_string(cfg.database_url);
  if (!connect) {
    spdlog::critical("cannot parse --database-url");
    return 2;
  }
  // Installs or upgrades tenure's schema (a no-op when current), then the sample's tables.
  if (auto migrated = tenure::postgres::migrate(cfg.database_url, cfg.schema); !migrated) {
    spdlog::critical("cannot migrate tenure's schema '{}': {}", cfg.schema, migrated.error().message());
    return 1;
  }
  const bool web = cfg.role == "web" || cfg.role == "all";
  const bool provider = cfg.role == "provider" || cfg.role == "all";
  const bool worker = cfg.role == "worker" || cfg.role == "all";
  // Bounded waits on every statement of the sample's own sessions (the libpq `options` keyword
  // sets them at connect time, for every session the pool opens).
  const std::string limits = " options='-c statement_timeout=" + std::to_string(cfg.db_statement_timeout.count()) +
                             " -c lock_timeout=" + std::to_string(cfg.db_lock_timeout.count()) + "'";
  auto pool = std::make_shared<session_pool>(connect.value() + " connect_timeout=5" + limits,
                                             static_cast<std::size_t>(worker ? cfg.concurrency + 4 : 8));
  {
    auto db = pool->acquire(milliseconds{10'000}, &why);
    if (!db) {
      spdlog::critical("{}", why);
      return 1;
    }
    try {
      ensure_tables(**db, cfg.app_schema);
    } catch (const std::exception& e) {
      spdlog::critical("cannot create the sample's tables in '{}': {}", cfg.app_schema, e.what());
      return 1;
    }
  }

  std::unique_ptr<http_server> provider_server, web_server;
  std::unique_ptr<tenure::runtime> rt;
  if (provider) {
    provider_server = std::make_unique<http_server>(http_server::options{.name = "provider", .handler_threads = 16},
                                                    make_provider_handler(cfg, pool));
    serve(*provider_server, cfg.role == "all" ? cfg.provider_listen : cfg.listen, cfg.role == "all" ? "provider " : "");
    if (cfg.role == "all") cfg.provider_url = provider_server->url();
  }
  // The worker is built first (its metrics are served below) but started last: every port is
  // bound before it claims anything, so a port already in use ends the process before it holds an
  // attempt (which would otherwise wait for rescue).
  if (worker) {
    rt = make_worker(cfg, pool, &why);
    if (!rt) {
      spdlog::critical("cannot start the worker: {}", why);
      return 1;
    }
  }
  auto runtime_metrics = [&rt]() { return rt ? rt->prometheus_text() : std::string{}; };
  if (web) {
    web_server = std::make_unique<http_server>(http_server::options{.name = "web", .max_body = cfg.max_body},
                                               make_web_handler(cfg, pool, runtime_metrics));
    serve(*web_server, cfg.listen, "");
  } else if (worker && !cfg.listen.empty()) {
    web_server = std::make_unique<http_server>(http_server::options{.name = "worker"},
                                               make_status_handler(pool, runtime_metrics));
    serve(*web_server, cfg.listen, "");
  }
  if (rt) {
    if (auto started = rt->start(); !started) {
      spdlog::critical("cannot start the worker: {}", started.error().message());
      return 1;
    }
  }

  // Wait for SIGINT/SIGTERM (blocked in every thread; taken here), then shut down in order.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("{}: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
  if (web_server) web_server->stop();
  if (rt) rt->stop();  // lets running handlers finish, flushes completions
  if (provider_server) provider_server->stop();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace billing

int main(int argc, char** argv) {
  using namespace billing;
  auto level = spdlog::level::info;
  config cfg = parse(argc, argv, level);
  if (cfg.role == "client") return run_client(cfg);

  // Signals are taken by sigwait in run(): block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto logger = spdlog::stderr_color_mt("billing");
  const std::string who = cfg.role == "worker" && !cfg.worker_name.empty() ? cfg.worker_name : cfg.role;
  logger->set_pattern("%H:%M:%S.%e " + who + " %^%l%$ %v");
  logger->set_level(level);
  spdlog::set_default_logger(logger);
  tenure::set_logger(logger);  // tenure logs to its own logger: the same lines, the same sink
  try {
    return run(std::move(cfg));
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
}
