#pragma once
// What the fuzz targets share: a property check that stops the run with a message, and reference
// implementations written independently of the code under test.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace tenure::fuzz {

/// Stops the run (libFuzzer saves the input) when a property does not hold.
[[noreturn]] inline void property_failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "fuzz property failed at %s:%d: %s\n", file, line, what);
  std::abort();
}
#define FUZZ_CHECK(cond) ((cond) ? (void)0 : ::tenure::fuzz::property_failed(#cond, __FILE__, __LINE__))

/// Decodes `s` as UTF-8 code point by code point (RFC 3629: no overlongs, no surrogates, nothing
/// past U+10FFFF) and calls f(code_point) for each; false at the first invalid byte.
template <class F>
bool for_each_code_point(std::string_view s, F&& f) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    std::uint32_t cp = 0;
    std::size_t len = 0;
    std::uint32_t min = 0;
    if (b0 < 0x80) { cp = b0; len = 1; min = 0; }
    else if ((b0 & 0xE0) == 0xC0) { cp = b0 & 0x1Fu; len = 2; min = 0x80; }
    else if ((b0 & 0xF0) == 0xE0) { cp = b0 & 0x0Fu; len = 3; min = 0x800; }
    else if ((b0 & 0xF8) == 0xF0) { cp = b0 & 0x07u; len = 4; min = 0x10000; }
    else return false;
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = cp << 6 | (b & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    f(cp);
    i += len;
  }
  return true;
}

inline bool valid_utf8(std::string_view s) {
  return for_each_code_point(s, [](std::uint32_t) {});
}

/// Valid UTF-8 with no NUL: what PostgreSQL stores as text.
inline bool storable(std::string_view s) {
  bool nul = false;
  return for_each_code_point(s, [&](std::uint32_t cp) { nul |= cp == 0; }) && !nul;
}

/// Code points, as PostgreSQL's length() counts them (only for valid UTF-8).
inline std::size_t code_points(std::string_view s) {
  std::size_t n = 0;
  for_each_code_point(s, [&](std::uint32_t) { ++n; });
  return n;
}

/// A C0 or C1 control character or DEL (PostgreSQL's [[:cntrl:]] in UTF-8).
inline bool has_control(std::string_view s) {
  bool any = false;
  for_each_code_point(s, [&](std::uint32_t cp) { any |= cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); });
  return any;
}

}  // namespace tenure::fuzz
