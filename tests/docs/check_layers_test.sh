#!/usr/bin/env bash
# scripts/check-layers on a small tree made here: a bridge header that reaches tenure/runtime.hpp
# (directly, or through another public header) and namespace-scope `using` declarations or
# directives in public headers are refused; type aliases, class members and a clean bridge pass.
set -euo pipefail
src=$1
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/include/tenure/sub" "$tree/sdk" "$tree/adapters"
cd "$tree/include/tenure"

cat >runtime.hpp <<'EOF'
#pragma once
#include <chrono>
namespace tenure {
using clock_type = std::chrono::steady_clock;  // an alias: fine
class runtime {
 public:
  using handler = int;  // a member alias: fine
};
}  // namespace tenure
EOF
cat >tx_bridge.hpp <<'EOF'
#pragma once
namespace tenure {
template <class Tx, class = void>
struct tx_bridge;
}
EOF
cat >good_bridge.hpp <<'EOF'
#pragma once
#include <libpq-fe.h>
#include "tenure/tx_bridge.hpp"
// #include "tenure/runtime.hpp" (a comment, not an include)
EOF
cat >direct_bridge.hpp <<'EOF'
#pragma once
#include <soci/soci.h>
#include "tenure/runtime.hpp"
EOF
cat >middle.hpp <<'EOF'
#pragma once
#include "tenure/runtime.hpp"
EOF
cat >indirect_bridge.hpp <<'EOF'
#pragma once
#include <pqxx/pqxx>
#include "tenure/middle.hpp"
EOF
cat >leaky.hpp <<'EOF'
#pragma once
#include <chrono>
#include <string>
using namespace std;
namespace tenure {
using std::chrono::milliseconds;
namespace inner {
using namespace std::chrono_literals;
}
struct base { void f(); };
struct derived : base {
  using base::f;  // a member: fine
  void g() {
    using namespace std;  // in a function body: fine
  }
};
#define TENURE_LEAK using std::string;
const char* text = "using std::string;";
}  // namespace tenure
namespace tenure::sub {
using
  std::string;
}
EOF

out=$("$src/scripts/check-layers" --root "$tree" 2>&1) && { echo "$out"; echo "check-layers passed a bad tree"; exit 1; }
echo "$out"
fail=0
expect() {
  if ! grep -qF -- "$1" <<<"$out"; then echo "MISSING: $1"; fail=1; fi
}
refuse() {
  if grep -qF -- "$1" <<<"$out"; then echo "UNEXPECTED: $1"; fail=1; fi
}
expect "include/tenure/direct_bridge.hpp: a bridge header includes tenure/runtime.hpp"
expect "include/tenure/indirect_bridge.hpp: a bridge header includes tenure/runtime.hpp (tenure/indirect_bridge.hpp -> tenure/middle.hpp -> tenure/runtime.hpp)"
refuse "good_bridge.hpp"
refuse "middle.hpp: a bridge"
expect "include/tenure/leaky.hpp:4: \`using namespace std;\`"
expect "include/tenure/leaky.hpp:6: \`using std::chrono::milliseconds;\`"
expect "include/tenure/leaky.hpp:8: \`using namespace std::chrono_literals;\`"
expect "include/tenure/leaky.hpp:21: \`using std::string;\`"
refuse "using base::f"
refuse "leaky.hpp:14"
refuse "leaky.hpp:18"
refuse "leaky.hpp:17"
refuse "runtime.hpp:4"
refuse "runtime.hpp:7"
n=$(grep -c "at namespace scope" <<<"$out" || true)
[ "$n" = 4 ] || { echo "expected 4 namespace-scope usings, found $n"; fail=1; }
[ $fail = 0 ] && echo "check-layers refuses what it should and nothing else"
exit $fail
