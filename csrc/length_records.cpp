#include "length_records.hpp"

#include <algorithm>
#include <cstring>

namespace omnibal {
namespace {

class Scanner {
 public:
  Scanner(const char* text, size_t size) : p_(text), end_(text + size) {}

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool at_end() const { return p_ >= end_; }
  char peek() const { return p_ < end_ ? *p_ : '\0'; }
  void advance() { ++p_; }

  // Reads a JSON string (the opening quote is current) into out; escapes are kept verbatim (keys we look
  // for have none). Returns false on an unterminated string.
  bool read_string(const char*& begin, size_t& len) {
    ++p_;
    begin = p_;
    while (p_ < end_ && *p_ != '"') p_ += (*p_ == '\\') ? 2 : 1;
    if (p_ >= end_) return false;
    len = static_cast<size_t>(p_ - begin);
    ++p_;
    return true;
  }

  // Skips one JSON value of any kind. Returns false on malformed input.
  bool skip_value() {
    skip_ws();
    if (p_ >= end_) return false;
    if (*p_ == '"') {
      const char* b;
      size_t n;
      return read_string(b, n);
    }
    if (*p_ == '{' || *p_ == '[') {
      int depth = 0;
      while (p_ < end_) {
        const char c = *p_;
        if (c == '"') {
          const char* b;
          size_t n;
          if (!read_string(b, n)) return false;
          continue;
        }
        if (c == '{' || c == '[') ++depth;
        if (c == '}' || c == ']') {
          --depth;
          if (depth == 0) {
            ++p_;
            return true;
          }
        }
        ++p_;
      }
      return false;
    }
    // number or literal
    const char* start = p_;
    while (p_ < end_ && *p_ != ',' && *p_ != '}' && *p_ != ']' && *p_ != ' ' && *p_ != '\n' && *p_ != '\r' &&
           *p_ != '\t')
      ++p_;
    return p_ > start;
  }

  // Reads a value that must be a non-negative JSON integer below 2**31 (no fraction, no exponent).
  // Returns an empty string on success, else a description of the value found.
  std::string read_count(int64_t& out) {
    skip_ws();
    const char* start = p_;
    if (!skip_value()) return "a malformed value";
    const size_t n = static_cast<size_t>(p_ - start);
    auto shown = [&] { return std::string(start, n < 40 ? n : 40); };
    if (n == 0) return "an empty value";
    if (*start == '-') return "a negative value " + shown();
    int64_t v = 0;
    for (const char* c = start; c < p_; ++c) {
      if (*c < '0' || *c > '9') return "a non-integer value " + shown();
      v = v * 10 + (*c - '0');
      if (v >= (int64_t{1} << 31)) return "a value too large (" + shown() + ")";
    }
    out = v;
    return std::string();
  }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace

LengthRecords parse_length_records(const char* text, size_t size, const std::string& vit_key,
                                   const std::string& llm_key) {
  LengthRecords out;
  Scanner s(text, size);
  s.skip_ws();
  const bool in_array = s.peek() == '[';
  if (in_array) s.advance();
  int64_t index = 0;
  auto fail = [&](const std::string& msg) {
    out.error = msg;
    out.error_sample = index;
    return out;
  };
  while (true) {
    s.skip_ws();
    if (s.peek() == ',') {
      s.advance();
      continue;
    }
    if (s.at_end()) {
      if (in_array) {
        out.error_sample = -1;
        out.error = "the JSON list is not closed with ']'";
      }
      return out;
    }
    if (in_array && s.peek() == ']') return out;
    if (s.peek() != '{') return fail("expected an object per sample");
    s.advance();
    int64_t vit = 0, llm = -1;
    while (true) {
      s.skip_ws();
      if (s.peek() == ',') {
        s.advance();
        continue;
      }
      if (s.peek() == '}') {
        s.advance();
        break;
      }
      if (s.peek() != '"') return fail("malformed object");
      const char* key;
      size_t key_len;
      if (!s.read_string(key, key_len)) return fail("unterminated string");
      s.skip_ws();
      if (s.peek() != ':') return fail("malformed object");
      s.advance();
      const bool is_vit = key_len == vit_key.size() && std::memcmp(key, vit_key.data(), key_len) == 0;
      const bool is_llm = key_len == llm_key.size() && std::memcmp(key, llm_key.data(), key_len) == 0;
      if (is_vit || is_llm) {
        int64_t v = 0;
        const std::string problem = s.read_count(v);
        if (!problem.empty()) return fail("'" + (is_vit ? vit_key : llm_key) + "' is " + problem);
        (is_vit ? vit : llm) = v;
      } else if (!s.skip_value()) {
        return fail("malformed value");
      }
    }
    if (llm < 0) return fail("'" + llm_key + "' is missing");
    out.vit.push_back(vit);
    out.llm.push_back(llm);
    ++index;
  }
}

LoadStats load_stats(const int64_t* vit, const int64_t* llm, int64_t n, int64_t llm_bin) {
  LoadStats s;
  for (int64_t i = 0; i < n; ++i) {
    s.vit_sum += vit[i];
    s.llm_sum += llm[i];
    s.vit_max = std::max(s.vit_max, vit[i]);
    s.llm_max = std::max(s.llm_max, llm[i]);
    s.llm_sum_binned += (llm[i] + llm_bin - 1) / llm_bin;
  }
  s.llm_sum_binned *= llm_bin;
  return s;
}

bool ids_in_range(const int64_t* ids, int64_t count, int64_t num_samples, int64_t& bad) {
  for (int64_t k = 0; k < count; ++k) {
    if (ids[k] < 0 || ids[k] >= num_samples) {
      bad = k;
      return false;
    }
  }
  return true;
}

}  // namespace omnibal
