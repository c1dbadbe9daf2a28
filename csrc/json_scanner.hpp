// A strict JSON scanner over a byte range: the RFC 8259 grammar over UTF-8 text (RFC 3629). It checks every
// byte it passes, skipped values included, so a text it reads to the end is well-formed JSON and valid UTF-8.
// Header-only, so that the record loop of length_records.cpp inlines these methods: they run once per string
// and number of a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

// Error paths: out of line, so that the loops over valid text stay small.
#if defined(__GNUC__)
#define OMNIBAL_COLD __attribute__((cold, noinline))
#else
#define OMNIBAL_COLD
#endif

namespace omnibal {
namespace json {

// Deeper nesting in a skipped value is refused rather than recursed into (the skip is recursive).
constexpr int kMaxDepth = 512;

// What the scanner reports at a byte sequence that is not UTF-8; the record reader replaces it with the
// bytes found (Scanner::not_utf8_here).
constexpr const char* kNotUtf8 = "bytes that are not UTF-8";

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

inline int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Four hex digits at p (advanced past them); false if there are not four.
inline bool read_hex4(const char*& p, const char* end, uint32_t& cp) {
  if (end - p < 4) return false;
  cp = 0;
  for (int k = 0; k < 4; ++k) {
    const int h = hex_value(p[k]);
    if (h < 0) return false;
    cp = cp * 16 + static_cast<uint32_t>(h);
  }
  p += 4;
  return true;
}

// How many bytes at p form one well-formed UTF-8 character (RFC 3629: no overlong form, no surrogate, nothing
// above U+10FFFF), or minus the number of bytes that show it is not one (at least 1).
inline int utf8_sequence(const char* p, const char* end) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  const unsigned char c = u[0];
  if (c < 0x80) return 1;
  // The range of the second byte (later ones are 0x80..0xBF): below 0xA0 after 0xE0 and below 0x90 after 0xF0
  // is an overlong form, above 0x9F after 0xED a UTF-16 surrogate, above 0x8F after 0xF4 past U+10FFFF.
  int n = 0;
  unsigned char low = 0x80, high = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    low = c == 0xE0 ? 0xA0 : 0x80;
    high = c == 0xED ? 0x9F : 0xBF;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    low = c == 0xF0 ? 0x90 : 0x80;
    high = c == 0xF4 ? 0x8F : 0xBF;
  } else {
    return -1;  // a continuation byte without a lead, an overlong lead (0xC0, 0xC1) or 0xF5..0xFF
  }
  const std::ptrdiff_t left = end - p;
  if (left < 2) return -1;  // cut by the end of the text
  if (u[1] < low || u[1] > high) return -2;
  for (int k = 2; k < n; ++k) {
    if (left <= k) return -k;
    if ((u[k] & 0xC0) != 0x80) return -(k + 1);
  }
  return n;
}

// Valid UTF-8 text shown in a message: at most `limit` bytes, never cut inside a character, control characters
// shown as spaces (a message stays one line), "..." where it was cut.
inline std::string excerpt(const char* p, size_t n, size_t limit = 40) {
  size_t cut = n < limit ? n : limit;
  while (cut > 0 && cut < n && (static_cast<unsigned char>(p[cut]) & 0xC0) == 0x80) --cut;
  std::string out(p, cut);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  if (cut < n) out += "...";
  return out;
}

// Bytes that need no attention inside a JSON string: ASCII, not a quote, a backslash or a control character.
struct PlainInString {
  bool plain[256];
  constexpr PlainInString() : plain() {
    for (int c = 0; c < 256; ++c) plain[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
  }
  bool operator[](unsigned char c) const { return plain[c]; }
};
constexpr PlainInString kPlainInString;

// The scanner. Methods that can fail return nullptr on success and a description of what they found otherwise,
// leaving the position at the problem.
class Scanner {
 public:
  Scanner(const char* text, size_t size) : begin_(text), p_(text), end_(text + size) {}

  void skip_ws() {
    const char* p = p_;
    while (p < end_ && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) ++p;
    p_ = p;
  }
  // Skips whitespace; returns whether it held a newline or reached the end.
  bool skip_to_next_line() {
    bool newline = false;
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) newline |= *p_++ == '\n';
    return newline || p_ >= end_;
  }
  bool at_end() const { return p_ >= end_; }
  char peek() const { return p_ < end_ ? *p_ : '\0'; }
  void advance() { ++p_; }
  const char* here() const { return p_; }
  // Moves back to a position read before, so that an error found later is reported where its value starts.
  void rewind(const char* to) { p_ = to; }

  // "line L, column C" of the current position (1-based; columns count characters). Only used for errors:
  // everything before the position was checked to be UTF-8, so counting lead bytes counts characters.
  std::string position() const {
    int64_t line = 1;
    const char* line_start = begin_;
    for (const char* c = begin_; c < p_ && c < end_; ++c) {
      if (*c == '\n') {
        ++line;
        line_start = c + 1;
      }
    }
    int64_t column = 1;
    for (const char* c = line_start; c < p_ && c < end_; ++c) column += (static_cast<unsigned char>(*c) & 0xC0) != 0x80;
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }

  // When the current position starts a byte sequence that is not UTF-8: "bytes that are not UTF-8: 0x.. 0x..",
  // naming the bytes that show it. Else an empty string.
  std::string not_utf8_here() const {
    if (p_ >= end_ || static_cast<unsigned char>(*p_) < 0x80) return std::string();
    const int n = utf8_sequence(p_, end_);
    if (n > 0) return std::string();
    std::string out = kNotUtf8;
    out += ':';
    static const char kHex[] = "0123456789ABCDEF";
    for (int k = 0; k < -n; ++k) {
      const auto b = static_cast<unsigned char>(p_[k]);
      out += " 0x";
      out += kHex[b >> 4];
      out += kHex[b & 0xF];
    }
    return out;
  }

  // Reads a JSON string (the opening quote is current): the raw bytes between the quotes, and whether they
  // hold escapes (decode_string resolves them).
  const char* read_string(const char*& raw, size_t& raw_len, bool& escaped) {
    ++p_;
    raw = p_;
    escaped = false;
    while (true) {
      // Plain bytes are most of a file: skip them with one table look-up each (on a local copy of the
      // position, which stays in a register).
      const char* p = p_;
      while (p < end_ && kPlainInString[static_cast<unsigned char>(*p)]) ++p;
      p_ = p;
      if (p_ >= end_) return "an unterminated string";
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        raw_len = static_cast<size_t>(p_ - raw);
        ++p_;
        return nullptr;
      }
      if (c >= 0x80) {
        // Text in other scripts comes in runs: check them here, without going back to the loop above.
        do {
          const int n = utf8_sequence(p_, end_);
          if (n < 0) return kNotUtf8;
          p_ += n;
        } while (p_ < end_ && static_cast<unsigned char>(*p_) >= 0x80);
        continue;
      }
      if (c < 0x20) return "a control character inside a string";
      escaped = true;  // a backslash
      if (p_ + 1 >= end_) return "an unterminated string";
      const char e = p_[1];
      if (e == 'u') {
        const char* q = p_ + 2;
        uint32_t cp;
        if (!read_hex4(q, end_, cp)) return "a malformed \\u escape in a string";
        p_ = q;
      } else if (e != '\0' && std::strchr("\"\\/bfnrt", e) != nullptr) {
        p_ += 2;
      } else {
        return "an unknown escape in a string";
      }
    }
  }

  // Reads a JSON number: `integral` (no fraction or exponent), `negative`, and its integer digits (after '-').
  const char* read_number(bool& integral, bool& negative, const char*& digits, size_t& num_digits) {
    integral = false;
    negative = peek() == '-';
    if (negative) ++p_;
    digits = p_;
    if (!is_digit(peek())) return "a malformed number";
    if (*p_ == '0') {
      ++p_;
      if (is_digit(peek())) return "a number with a leading zero";
    } else {
      while (is_digit(peek())) ++p_;
    }
    num_digits = static_cast<size_t>(p_ - digits);
    integral = true;
    if (peek() == '.') {
      integral = false;
      ++p_;
      if (!is_digit(peek())) return "a malformed number";
      while (is_digit(peek())) ++p_;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++p_;
      if (peek() == '+' || peek() == '-') ++p_;
      if (!is_digit(peek())) return "a malformed number";
      while (is_digit(peek())) ++p_;
    }
    return nullptr;
  }

  // Skips one JSON value of any kind, checking its grammar and its UTF-8.
  const char* skip_value(int depth = 0) {
    if (depth > kMaxDepth) return "values nested too deeply (more than 512 levels)";
    skip_ws();
    if (p_ >= end_) return "a missing value";
    const char c = *p_;
    const char* raw;
    size_t n;
    bool escaped;
    if (c == '"') return read_string(raw, n, escaped);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++p_;
      skip_ws();
      if (peek() == close) {
        ++p_;
        return nullptr;
      }
      while (true) {
        if (c == '{') {
          if (peek() != '"') return "a malformed object (expected a key)";
          if (const char* problem = read_string(raw, n, escaped)) return problem;
          skip_ws();
          if (peek() != ':') return "a malformed object (expected ':')";
          ++p_;
        }
        if (const char* problem = skip_value(depth + 1)) return problem;
        skip_ws();
        if (peek() == ',') {
          ++p_;
          skip_ws();
          continue;
        }
        if (peek() == close) {
          ++p_;
          return nullptr;
        }
        return c == '{' ? "a malformed object (expected ',' or '}')" : "a malformed list (expected ',' or ']')";
      }
    }
    if (c == '-' || is_digit(c)) {
      bool integral, negative;
      const char* digits;
      return read_number(integral, negative, digits, n);
    }
    for (const char* literal : {"true", "false", "null"}) {
      const size_t len = std::strlen(literal);
      if (static_cast<size_t>(end_ - p_) >= len && std::memcmp(p_, literal, len) == 0) {
        p_ += len;
        return nullptr;
      }
    }
    return "a malformed value";
  }

  // Reads a value that must be a non-negative JSON integer below 2**31 (no fraction, no exponent; -0 is 0).
  // Returns false with a description of the value found in `problem` (quoting whole characters only).
  bool read_count(int64_t& out, std::string& problem) {
    skip_ws();
    const char* start = p_;
    const char* bad = nullptr;
    bool integral = false, negative = false;
    if (peek() == '-' || is_digit(peek())) {
      const char* digits;
      size_t num_digits = 0;
      bad = read_number(integral, negative, digits, num_digits);
      if (!bad && integral && num_digits <= 10) {  // ten digits stay far inside int64
        int64_t v = 0;
        for (size_t k = 0; k < num_digits; ++k) v = v * 10 + (digits[k] - '0');
        if (v < (int64_t{1} << 31) && (!negative || v == 0)) {
          out = v;
          return true;
        }
      }
    } else {
      bad = skip_value();
    }
    problem = count_problem(start, bad, integral, negative);
    return false;
  }

 private:
  // Why the value from `start` to the position is not a count (read_count's error path, kept out of its way).
  OMNIBAL_COLD std::string count_problem(const char* start, const char* bad, bool integral, bool negative) const {
    if (bad) return bad;
    const std::string shown = excerpt(start, static_cast<size_t>(p_ - start));
    if (!integral) return "a non-integer value " + shown;
    if (negative) return "a negative value " + shown;
    return "a value too large (" + shown + ")";
  }

  const char* begin_;
  const char* p_;
  const char* end_;
};

}  // namespace json
}  // namespace omnibal
