// Built against an installed tenure with only COMPONENTS postgres libpq.
#include <iostream>

#include <tenure/libpq.hpp>
#include <tenure/postgres/schema.hpp>

int main() {
  // The bridge links and refuses without a connection (and with an empty token).
  auto refused = tenure::complete_in_tx(static_cast<PGconn*>(nullptr), tenure::finalization_token{});
  if (refused) return 1;
  std::cout << "consumer ok: libpq only, schema version " << tenure::postgres::known_schema_version() << "\n";
  return 0;
}
