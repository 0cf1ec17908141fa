// Text repair before storage (sdk/runtime/storable.hpp): handler messages, args and metadata
// made into text PostgreSQL stores, checked against an independent UTF-8 decoder.
#include <fuzzer/FuzzedDataProvider.h>

#include "fuzz_check.hpp"
#include "sdk/runtime/storable.hpp"

namespace {

using json = nlohmann::json;
using tenure::fuzz::storable;

json some_json(FuzzedDataProvider& in, int depth = 0) {
  switch (in.ConsumeIntegralInRange(0, depth > 3 ? 1 : 3)) {
    case 0: return in.ConsumeRandomLengthString(32);
    case 1: return in.ConsumeIntegral<int>();
    case 2: {
      json a = json::array();
      for (int n = in.ConsumeIntegralInRange(0, 3); n > 0; --n) a.push_back(some_json(in, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int n = in.ConsumeIntegralInRange(0, 3); n > 0; --n) o[in.ConsumeRandomLengthString(16)] = some_json(in, depth + 1);
      return o;
    }
  }
}

/// Same shape (types, sizes, numbers) as `v`: repair changes text only.
bool same_shape(const json& a, const json& b) {
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!same_shape(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) return b.size() <= a.size();  // two keys may repair to the same key
  if (a.is_string()) return true;
  return a == b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text{reinterpret_cast<const char*>(data), size};

  // The check agrees with the reference decoder.
  const bool was_storable = tenure::detail::is_storable_text(text);
  FUZZ_CHECK(was_storable == storable(text));

  // The repaired text is valid UTF-8 without NUL; it is the input itself when nothing needed
  // repair, and `replaced` says whether anything did. Repair is idempotent, and each input byte
  // becomes at most one U+FFFD (3 bytes).
  bool replaced = false;
  const std::string out = tenure::detail::storable_text(text, &replaced);
  FUZZ_CHECK(storable(out));
  FUZZ_CHECK(out.find('\0') == std::string::npos);
  FUZZ_CHECK(replaced == !was_storable);
  if (was_storable) FUZZ_CHECK(out == text);
  FUZZ_CHECK(out.size() <= 3 * text.size());
  bool again = false;
  FUZZ_CHECK(tenure::detail::storable_text(out, &again) == out && !again);

  // JSON: repaired values are storable, keep their shape, print (dump() throws on invalid
  // UTF-8) and read back as the same value.
  FuzzedDataProvider in(data, size);
  const json v = some_json(in);
  bool json_replaced = false;
  const json fixed = tenure::detail::storable_json(v, &json_replaced);
  FUZZ_CHECK(tenure::detail::is_storable_json(fixed));
  FUZZ_CHECK(same_shape(v, fixed));
  FUZZ_CHECK(json_replaced == !tenure::detail::is_storable_json(v));
  if (!json_replaced) FUZZ_CHECK(fixed == v);
  const std::string dumped = tenure::detail::storable_json_text(v);
  FUZZ_CHECK(storable(dumped));
  FUZZ_CHECK(json::parse(dumped) == fixed);
  return 0;
}
