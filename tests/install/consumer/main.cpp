// Built against an installed tenure by tests/install/consumer_test.sh.
#include <iostream>

#include <tenure/libpq.hpp>
#include <tenure/postgres/runtime.hpp>
#include <tenure/postgres/schema.hpp>
#include <tenure/postgres/store.hpp>
#include <tenure/soci.hpp>
#include <tenure/pqxx.hpp>
#include <tenure/token.hpp>

int main() {
  auto token = tenure::finalization_token::parse("tn2:42:7:00112233445566778899aabbccddeeff");
  if (!token || token.value().run_lease() != 7) return 1;
  auto bad = tenure::finalization_token::parse("tn1:42:7");
  if (bad || bad.error() != tenure::errc::malformed_token) return 1;
  // The bridges link: outside a transaction (here: no connection at all) complete_in_tx refuses.
  auto refused = tenure::complete_in_tx(static_cast<PGconn*>(nullptr), token.value());
  if (refused || refused.error() != tenure::errc::protocol_error) return 1;
  std::cout << "consumer ok: schema version " << tenure::postgres::known_schema_version() << ", token "
            << token.value().to_string() << "\n";
  return 0;
}
