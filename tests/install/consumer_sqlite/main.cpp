// Built against an installed tenure with only COMPONENTS sqlite testing: a job enqueued through
// the fault injector into the SQLite fake, then one refused call.
#include <iostream>

#include <tenure/sqlite/store.hpp>
#include <tenure/testing/faulty_store.hpp>

int main() {
  auto inner = tenure::sqlite::store::open(":memory:", tenure::system_clock::instance());
  if (!inner) return 1;
  tenure::testing::faulty_store db(*inner.value());
  auto id = db.enqueue({.kind = "consumer"});
  if (!id) return 1;
  db.lose_connection();
  if (db.enqueue({.kind = "consumer"})) return 1;
  std::cout << "consumer ok: sqlite and testing, job " << id.value() << "\n";
  return 0;
}
