#pragma once
/// \file
/// Text and JSON a handler hands over, made storable before it reaches the database. PostgreSQL
/// refuses invalid UTF-8 in text (22021) and NUL characters in text and jsonb (22P05), and libpq
/// would cut a parameter at its first NUL byte without a word. Such a value would be refused on
/// every retry, so it is repaired at the boundary instead: each offending byte sequence becomes
/// U+FFFD, and the caller is told that something was replaced (so it can log it). The checks
/// (is_storable_*) are also what the stores enforce, so that the SQLite fake refuses what
/// PostgreSQL refuses. Private to tenure.
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tenure::detail {

inline constexpr std::string_view k_replacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

/// Length of the valid UTF-8 sequence starting at s[i] (overlong forms, surrogates and code
/// points past U+10FFFF are invalid), or 0 when it is not one.
inline std::size_t utf8_sequence(std::string_view s, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](std::size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) > 0x9F) return 0;  // UTF-16 surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) > 0x8F) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

/// True when PostgreSQL stores `s` as text unchanged: valid UTF-8 without NUL characters.
inline bool is_storable_text(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = s[i] == '\0' ? 0 : utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// True when every string and object key in `v` is storable text (jsonb refuses \u0000 too).
inline bool is_storable_json(const nlohmann::json& v) noexcept {
  if (v.is_string()) return is_storable_text(v.get_ref<const std::string&>());
  if (v.is_array()) {
    for (const auto& e : v) {
      if (!is_storable_json(e)) return false;
    }
  } else if (v.is_object()) {
    for (const auto& [k, e] : v.items()) {
      if (!is_storable_text(k) || !is_storable_json(e)) return false;
    }
  }
  return true;
}

/// `s` with every NUL and every byte that does not start a valid UTF-8 sequence replaced by
/// U+FFFD; `replaced` (when given) is set when anything was.
inline std::string storable_text(std::string_view s, bool* replaced = nullptr) {
  std::string out;
  out.reserve(s.size());
  bool any = false;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = s[i] == '\0' ? 0 : utf8_sequence(s, i);
    if (n == 0) {
      out += k_replacement;
      any = true;
      ++i;
      continue;
    }
    out.append(s, i, n);
    i += n;
  }
  if (replaced && any) *replaced = true;
  return out;
}

/// `v` with storable_text applied to every string and object key, recursively.
inline nlohmann::json storable_json(const nlohmann::json& v, bool* replaced = nullptr) {
  if (v.is_string()) return storable_text(v.get_ref<const std::string&>(), replaced);
  if (v.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : v) out.push_back(storable_json(e, replaced));
    return out;
  }
  if (v.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [k, e] : v.items()) out[storable_text(k, replaced)] = storable_json(e, replaced);
    return out;
  }
  return v;
}

/// JSON text of `v` that PostgreSQL's jsonb accepts (see storable_json).
inline std::string storable_json_text(const nlohmann::json& v, bool* replaced = nullptr) {
  return storable_json(v, replaced).dump();
}

}  // namespace tenure::detail
