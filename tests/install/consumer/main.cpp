// Built against an installed tenure by tests/install/consumer_test.sh.
#include <iostream>

#include <tenure/postgres/schema.hpp>
#include <tenure/postgres/store.hpp>
#include <tenure/soci.hpp>
#include <tenure/token.hpp>

int main() {
  auto token = tenure::finalization_token::parse("tn1:42:7");
  if (!token || token.value().run_lease() != 7) return 1;
  auto bad = tenure::finalization_token::parse("tn1:0:7");
  if (bad || bad.error() != tenure::errc::malformed_token) return 1;
  std::cout << "consumer ok: schema version " << tenure::postgres::known_schema_version() << ", token "
            << token.value().to_string() << "\n";
  return 0;
}
