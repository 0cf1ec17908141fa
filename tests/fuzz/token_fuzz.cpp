// The finalization token parser (tenure::finalization_token::parse, attempt_secret::parse).
#include <cstring>

#include <fuzzer/FuzzedDataProvider.h>

#include "fuzz_check.hpp"
#include "tenure/token.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using tenure::attempt_secret;
  using tenure::finalization_token;
  const std::string_view text{reinterpret_cast<const char*>(data), size};

  // Whatever parses is a valid token that prints back as the very same text (one spelling each).
  if (const auto t = finalization_token::parse(text)) {
    FUZZ_CHECK(t.value().to_string() == text);
    FUZZ_CHECK(t.value().job_id() > 0 && t.value().run_lease() > 0);
    FUZZ_CHECK(text.size() <= finalization_token::max_text_size);
    FUZZ_CHECK(text.starts_with(finalization_token::prefix));
  } else {
    FUZZ_CHECK(t.error() == tenure::errc::malformed_token);
  }
  if (const auto s = attempt_secret::parse(text)) {
    FUZZ_CHECK(s.value().to_string() == text);
  } else {
    FUZZ_CHECK(s.error() == tenure::errc::malformed_token);
  }

  // Every token the store can hand out prints as text that parses back to it.
  FuzzedDataProvider in(data, size);
  const auto job_id = in.ConsumeIntegralInRange<std::int64_t>(1, INT64_MAX);
  const auto run_lease = in.ConsumeIntegralInRange<std::int64_t>(1, INT64_MAX);
  attempt_secret::bytes_type bytes{};
  const auto raw = in.ConsumeBytes<std::uint8_t>(bytes.size());
  if (!raw.empty()) std::memcpy(bytes.data(), raw.data(), raw.size());
  const finalization_token made{{job_id, run_lease}, attempt_secret{bytes}};
  const std::string printed = made.to_string();
  FUZZ_CHECK(printed.size() <= finalization_token::max_text_size);
  const auto back = finalization_token::parse(printed);
  FUZZ_CHECK(back && back.value() == made);
  return 0;
}
