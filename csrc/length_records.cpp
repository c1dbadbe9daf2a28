// The reader of per-sample length records declared in length_records.hpp: a strict JSON scanner and the
// loop over the records of a JSON list or of JSON Lines.
#include "length_records.hpp"

#include <cstring>

namespace omnibal {
namespace {

// Deeper nesting in a skipped field is refused rather than recursed into (the skip is recursive).
constexpr int kMaxDepth = 512;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Four hex digits at p (advanced past them); false if there are not four.
bool read_hex4(const char*& p, const char* end, uint32_t& cp) {
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

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The value of a JSON string's raw bytes whose escapes were already checked by Scanner::read_string.
std::string decode_string(const char* p, size_t n) {
  std::string out;
  const char* end = p + n;
  while (p < end) {
    if (*p != '\\') {
      out += *p++;
      continue;
    }
    const char e = p[1];
    p += 2;
    if (e != 'u') {
      static const char kFrom[] = "\"\\/bfnrt";
      static const char kTo[] = "\"\\/\b\f\n\r\t";
      out += kTo[std::strchr(kFrom, e) - kFrom];
      continue;
    }
    uint32_t cp = 0;
    read_hex4(p, end, cp);
    // A surrogate pair encodes one code point above U+FFFF; a lone surrogate is kept as its own value.
    if (cp >= 0xD800 && cp < 0xDC00 && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
      const char* q = p + 2;
      uint32_t low = 0;
      if (read_hex4(q, end, low) && low >= 0xDC00 && low < 0xE000) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        p = q;
      }
    }
    append_utf8(out, cp);
  }
  return out;
}

// Bytes that need no attention inside a JSON string (not a quote, a backslash or a control character).
struct PlainInString {
  bool plain[256];
  constexpr PlainInString() : plain() {
    for (int c = 0; c < 256; ++c) plain[c] = c >= 0x20 && c != '"' && c != '\\';
  }
  bool operator[](unsigned char c) const { return plain[c]; }
};
constexpr PlainInString kPlainInString;

// A strict JSON scanner over a byte range (RFC 8259 grammar). Methods that can fail return nullptr on success
// and a description of what they found otherwise, leaving the position at the problem.
class Scanner {
 public:
  Scanner(const char* text, size_t size) : begin_(text), p_(text), end_(text + size) {}

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
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

  // "line L, column C" of the current position (1-based; columns count bytes). Only used for errors.
  std::string position() const {
    int64_t line = 1;
    const char* line_start = begin_;
    for (const char* c = begin_; c < p_ && c < end_; ++c) {
      if (*c == '\n') {
        ++line;
        line_start = c + 1;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(p_ - line_start + 1);
  }

  // Reads a JSON string (the opening quote is current): the raw bytes between the quotes, and whether they
  // hold escapes (decode_string resolves them).
  const char* read_string(const char*& raw, size_t& raw_len, bool& escaped) {
    ++p_;
    raw = p_;
    escaped = false;
    while (p_ < end_) {
      // Plain bytes are most of a file: skip them with one table look-up each.
      while (p_ < end_ && kPlainInString[static_cast<unsigned char>(*p_)]) ++p_;
      if (p_ >= end_) break;
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        raw_len = static_cast<size_t>(p_ - raw);
        ++p_;
        return nullptr;
      }
      if (c < 0x20) return "a control character inside a string";
      if (c != '\\') {
        ++p_;
        continue;
      }
      escaped = true;
      if (p_ + 1 >= end_) break;
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
    return "an unterminated string";
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

  // Skips one JSON value of any kind, checking its grammar.
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
  // Returns an empty string on success, else a description of the value found.
  std::string read_count(int64_t& out) {
    skip_ws();
    const char* start = p_;
    auto shown = [&] {
      const size_t n = static_cast<size_t>(p_ - start);
      return std::string(start, n < 40 ? n : 40);
    };
    if (peek() != '-' && !is_digit(peek())) {
      if (const char* problem = skip_value()) return problem;
      return "a non-integer value " + shown();
    }
    bool integral, negative;
    const char* digits;
    size_t num_digits = 0;
    if (const char* problem = read_number(integral, negative, digits, num_digits)) return problem;
    if (!integral) return "a non-integer value " + shown();
    int64_t v = 0;
    for (size_t k = 0; k < num_digits; ++k) {
      v = v * 10 + (digits[k] - '0');
      if (v >= (int64_t{1} << 31)) break;
    }
    if (negative && v != 0) return "a negative value " + shown();
    if (v >= (int64_t{1} << 31)) return "a value too large (" + shown() + ")";
    out = v;
    return std::string();
  }

 private:
  const char* begin_;
  const char* p_;
  const char* end_;
};

bool key_is(const char* raw, size_t n, bool escaped, const std::string& key) {
  if (!escaped) return n == key.size() && std::memcmp(raw, key.data(), n) == 0;
  return decode_string(raw, n) == key;
}

// Reads one sample's object (the current character must be '{'). Returns an empty string on success.
std::string read_record(Scanner& s, const std::string& vit_key, const std::string& llm_key, int64_t& vit,
                        int64_t& llm) {
  if (s.peek() != '{') return "expected an object per sample";
  s.advance();
  vit = 0;
  llm = -1;
  s.skip_ws();
  if (s.peek() == '}') {
    s.advance();
  } else {
    while (true) {
      if (s.peek() != '"') return "a malformed object (expected a key)";
      const char* raw;
      size_t n;
      bool escaped;
      if (const char* problem = s.read_string(raw, n, escaped)) return problem;
      s.skip_ws();
      if (s.peek() != ':') return "a malformed object (expected ':')";
      s.advance();
      const bool is_vit = key_is(raw, n, escaped, vit_key);
      const bool is_llm = !is_vit && key_is(raw, n, escaped, llm_key);
      if (is_vit || is_llm) {
        int64_t v = 0;
        const std::string problem = s.read_count(v);
        if (!problem.empty()) return "'" + (is_vit ? vit_key : llm_key) + "' is " + problem;
        (is_vit ? vit : llm) = v;
      } else if (const char* problem = s.skip_value()) {
        return "a field holds " + std::string(problem);
      }
      s.skip_ws();
      if (s.peek() == ',') {
        s.advance();
        s.skip_ws();
        continue;
      }
      if (s.peek() == '}') {
        s.advance();
        break;
      }
      return "a malformed object (expected ',' or '}')";
    }
  }
  if (llm < 0) return "'" + llm_key + "' is missing";
  return std::string();
}

}  // namespace

LengthRecords parse_length_records(const char* text, size_t size, const std::string& vit_key,
                                   const std::string& llm_key) {
  LengthRecords out;
  Scanner s(text, size);
  int64_t index = 0;
  auto fail = [&](const std::string& msg, int64_t sample) {
    out.error = msg + " (" + s.position() + ")";
    out.error_sample = sample;
    return out;
  };
  auto add = [&]() -> std::string {
    int64_t vit = 0, llm = -1;
    std::string problem = read_record(s, vit_key, llm_key, vit, llm);
    if (!problem.empty()) return problem;
    out.vit.push_back(vit);
    out.llm.push_back(llm);
    ++index;
    return problem;
  };

  s.skip_ws();
  if (s.at_end()) return out;
  if (s.peek() == '[') {  // one JSON list of objects
    s.advance();
    s.skip_ws();
    if (s.peek() == ']') {
      s.advance();
    } else {
      while (true) {
        if (s.at_end()) return fail("the JSON list is not closed with ']'", -1);
        const std::string problem = add();
        if (!problem.empty()) return fail(problem, index);
        s.skip_ws();
        if (s.peek() == ',') {
          s.advance();
          s.skip_ws();
          if (s.peek() == ']') return fail("a ',' before the closing ']'", -1);
          continue;
        }
        if (s.peek() == ']') {
          s.advance();
          break;
        }
        if (s.at_end()) return fail("the JSON list is not closed with ']'", -1);
        return fail("expected ',' or ']' after the previous sample", index);
      }
    }
    s.skip_ws();
    if (!s.at_end()) {
      return fail("unexpected data after the closing ']' (two JSON lists back to back? give each its own file)", -1);
    }
    return out;
  }
  // JSON Lines: objects separated by newlines (blank lines allowed).
  while (true) {
    const std::string problem = add();
    if (!problem.empty()) return fail(problem, index);
    if (!s.skip_to_next_line()) {
      return fail("expected a newline after the previous sample (one object per line)", index);
    }
    if (s.at_end()) return out;
  }
}

}  // namespace omnibal
