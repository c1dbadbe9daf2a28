// The reader of per-sample length records declared in length_records.hpp: one object per record, read with
// the strict scanner of json_scanner.hpp, in a JSON list or in JSON Lines.
#include "length_records.hpp"

#include <algorithm>
#include <cstring>

#include "json_scanner.hpp"

namespace omnibal {
namespace {

using json::Scanner;

// Counts must stay below this (the engine packs loads as int32).
constexpr int64_t kCountLimit = int64_t{1} << 31;

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
    json::read_hex4(p, end, cp);
    // A surrogate pair encodes one code point above U+FFFF; a lone surrogate is kept as its own value.
    if (cp >= 0xD800 && cp < 0xDC00 && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
      const char* q = p + 2;
      uint32_t low = 0;
      if (json::read_hex4(q, end, low) && low >= 0xDC00 && low < 0xE000) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        p = q;
      }
    }
    append_utf8(out, cp);
  }
  return out;
}

bool key_is(const char* raw, size_t n, bool escaped, const std::string& key) {
  if (!escaped) return n == key.size() && std::memcmp(raw, key.data(), n) == 0;
  return decode_string(raw, n) == key;
}

enum class Field { kVit, kLlm, kVitSeqlens, kLabel, kOther };

Field field_of(const char* raw, size_t n, bool escaped, const RecordKeys& keys) {
  if (key_is(raw, n, escaped, keys.vit)) return Field::kVit;
  if (key_is(raw, n, escaped, keys.llm)) return Field::kLlm;
  if (key_is(raw, n, escaped, keys.vit_seqlens)) return Field::kVitSeqlens;
  if (key_is(raw, n, escaped, keys.label)) return Field::kLabel;
  return Field::kOther;
}

// One record's fields as read; -1: absent. Where a value starts, for errors found after the whole object.
struct Record {
  int64_t vit = -1, llm = -1, label = -1;
  bool has_vit_seqlens = false;
  int64_t vit_seqlens_sum = 0;  // saturates at kCountLimit
  const char* vit_seqlens_at = nullptr;
  const char* label_at = nullptr;
};

// The messages of the error paths below, out of line.
OMNIBAL_COLD std::string about(const std::string& key, const char* verb, const std::string& problem) {
  return "'" + key + "' " + verb + " " + problem;
}
OMNIBAL_COLD std::string about_element(const std::string& key, int64_t k, const std::string& problem) {
  return "'" + key + "' element " + std::to_string(k) + " is " + problem;
}
OMNIBAL_COLD std::string sum_problem(const RecordKeys& keys, const Record& rec) {
  const std::string sum =
      rec.vit_seqlens_sum >= kCountLimit ? "more than 2**31 - 1" : std::to_string(rec.vit_seqlens_sum);
  if (rec.vit < 0) return about(keys.vit_seqlens, "sum to", sum + ", too large for a ViT load (below 2**31)");
  return about(keys.vit_seqlens, "sum to", sum + ", but '" + keys.vit + "' is " + std::to_string(rec.vit));
}
OMNIBAL_COLD std::string label_problem(const RecordKeys& keys, const Record& rec) {
  return about(keys.label, "is",
               std::to_string(rec.label) + ", more than '" + keys.llm + "' - 1 (" + std::to_string(rec.llm) +
                   " - 1): the targets are the sample's tokens after its first");
}

// Reads the list of ViT sequence lengths (the value is next), appending them to `flat`.
bool read_vit_seqlens(Scanner& s, const std::string& key, std::vector<int64_t>& flat, int64_t& sum,
                      std::string& problem) {
  s.skip_ws();
  const char* start = s.here();
  if (s.peek() != '[') {
    const char* bad = s.skip_value();
    problem = bad ? about(key, "holds", bad)
                  : about(key, "is",
                          json::excerpt(start, static_cast<size_t>(s.here() - start)) +
                              ", expected a list of non-negative integers");
    return false;
  }
  s.advance();
  s.skip_ws();
  sum = 0;
  if (s.peek() == ']') {
    s.advance();
    return true;
  }
  for (int64_t k = 0;; ++k) {
    s.skip_ws();
    if (s.peek() == '[' || s.peek() == '{') {
      problem = about_element(key, k,
                              std::string("a nested ") + (s.peek() == '[' ? "list" : "object") +
                                  ", expected a flat list of non-negative integers");
      return false;
    }
    int64_t v = 0;
    if (!s.read_count(v, problem)) {
      problem = about_element(key, k, problem);
      return false;
    }
    flat.push_back(v);
    if (sum < kCountLimit) sum += v;
    s.skip_ws();
    if (s.peek() == ',') {
      s.advance();
      continue;
    }
    if (s.peek() == ']') {
      s.advance();
      return true;
    }
    problem = about(key, "is", "a malformed list (expected ',' or ']')");
    return false;
  }
}

// Reads one field's value into `rec` (the value is next).
bool read_field(Scanner& s, Field field, const RecordKeys& keys, Record& rec, std::vector<int64_t>& flat,
                size_t run_start, std::string& problem) {
  if (field == Field::kOther) {
    const char* bad = s.skip_value();
    if (bad) problem = "a field holds " + std::string(bad);
    return bad == nullptr;
  }
  s.skip_ws();
  const char* at = s.here();
  if (field == Field::kVitSeqlens) {
    rec.vit_seqlens_at = at;
    flat.resize(run_start);  // a repeated key: its last list counts
    rec.has_vit_seqlens = true;
    return read_vit_seqlens(s, keys.vit_seqlens, flat, rec.vit_seqlens_sum, problem);
  }
  int64_t v = 0;
  if (!s.read_count(v, problem)) {
    problem = about(field == Field::kVit ? keys.vit : field == Field::kLlm ? keys.llm : keys.label, "is", problem);
    return false;
  }
  if (field == Field::kVit) rec.vit = v;
  if (field == Field::kLlm) rec.llm = v;
  if (field == Field::kLabel) {
    rec.label = v;
    rec.label_at = at;
  }
  return true;
}

// The checks across the fields of a record read whole. On an error the position moves to the value at fault.
bool check_record(Scanner& s, const RecordKeys& keys, Record& rec, std::string& problem) {
  if (rec.llm < 0) {
    problem = about(keys.llm, "is", "missing");
    return false;
  }
  if (rec.has_vit_seqlens) {
    if (rec.vit < 0 && rec.vit_seqlens_sum < kCountLimit) rec.vit = rec.vit_seqlens_sum;
    if (rec.vit_seqlens_sum != rec.vit) {
      s.rewind(rec.vit_seqlens_at);
      problem = sum_problem(keys, rec);
      return false;
    }
  }
  if (rec.vit < 0) rec.vit = 0;
  if (rec.label > std::max<int64_t>(rec.llm - 1, 0)) {
    s.rewind(rec.label_at);
    problem = label_problem(keys, rec);
    return false;
  }
  return true;
}

// Reads one sample's object (the current character must be '{'). Returns false with `problem` on an error.
bool read_record(Scanner& s, const RecordKeys& keys, Record& rec, std::vector<int64_t>& flat, std::string& problem) {
  if (s.peek() != '{') {
    problem = "expected an object per sample";
    return false;
  }
  s.advance();
  rec = Record();
  const size_t run_start = flat.size();
  s.skip_ws();
  if (s.peek() == '}') {
    s.advance();
    return check_record(s, keys, rec, problem);
  }
  while (true) {
    const char* bad = nullptr;
    const char* raw;
    size_t n;
    bool escaped;
    if (s.peek() != '"') {
      bad = "a malformed object (expected a key)";
    } else if (!(bad = s.read_string(raw, n, escaped))) {
      s.skip_ws();
      if (s.peek() != ':') bad = "a malformed object (expected ':')";
    }
    if (bad) {
      problem = bad;
      return false;
    }
    s.advance();
    if (!read_field(s, field_of(raw, n, escaped, keys), keys, rec, flat, run_start, problem)) return false;
    s.skip_ws();
    if (s.peek() == ',') {
      s.advance();
      s.skip_ws();
      continue;
    }
    if (s.peek() == '}') {
      s.advance();
      return check_record(s, keys, rec, problem);
    }
    problem = "a malformed object (expected ',' or '}')";
    return false;
  }
}

// Appends the optional fields of a record read whole. They start their arrays at the first record that has them.
void append_optional(LengthRecords& out, const Record& rec) {
  const size_t index = out.vit.size() - 1;
  if (rec.has_vit_seqlens && !out.has_vit_seqlens) {
    out.has_vit_seqlens = true;
    out.vit_seqlens_offsets.assign(index + 1, 0);  // the records before have no run, and the list is empty
    out.vit_seqlens_given.assign(index, 0);
  }
  if (out.has_vit_seqlens) {
    out.vit_seqlens_offsets.push_back(static_cast<int64_t>(out.vit_seqlens.size()));
    out.vit_seqlens_given.push_back(rec.has_vit_seqlens ? 1 : 0);
  }
  if (rec.label >= 0 && !out.has_label) {
    out.has_label = true;
    out.label.assign(index, -1);
  }
  if (out.has_label) out.label.push_back(rec.label);
}

void append(LengthRecords& out, const Record& rec) {
  out.vit.push_back(rec.vit);
  out.llm.push_back(rec.llm);
  if (rec.has_vit_seqlens || rec.label >= 0 || out.has_vit_seqlens || out.has_label) append_optional(out, rec);
}

}  // namespace

LengthRecords parse_length_records(const char* text, size_t size, const RecordKeys& keys) {
  LengthRecords out;
  Scanner s(text, size);
  auto fail = [&](const std::string& msg, int64_t sample) {
    // Bytes that are not UTF-8 where the scanner stopped are the problem, whatever it expected there.
    const std::string not_utf8 = s.not_utf8_here();
    out.error = (not_utf8.empty() ? msg : not_utf8) + " (" + s.position() + ")";
    out.error_sample = sample;
    return out;
  };
  Record rec;
  std::string problem;
  auto add = [&] {
    if (!read_record(s, keys, rec, out.vit_seqlens, problem)) return false;
    append(out, rec);
    return true;
  };
  auto index = [&] { return static_cast<int64_t>(out.vit.size()); };

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
        if (!add()) return fail(problem, index());
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
        return fail("expected ',' or ']' after the previous sample", index());
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
    if (!add()) return fail(problem, index());
    if (!s.skip_to_next_line()) {
      return fail("expected a newline after the previous sample (one object per line)", index());
    }
    if (s.at_end()) return out;
  }
}

}  // namespace omnibal
