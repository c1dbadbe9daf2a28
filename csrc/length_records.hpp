// A fast reader of per-sample length records: a JSON list of objects, or JSON Lines (one object per line),
// from which two integer fields are taken per object. No Python objects per sample, one pass over the bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace omnibal {

struct LengthRecords {
  std::vector<int64_t> vit;
  std::vector<int64_t> llm;
  // Empty on success; otherwise what went wrong, and at which sample (error_sample, -1 if none).
  std::string error;
  int64_t error_sample = -1;
};

// Reads `text`: one JSON array of objects (nothing but whitespace after its ']'), or JSON Lines (objects
// separated by newlines). The grammar is strict JSON (commas between items, no trailing commas). Keys are
// compared with their escapes decoded. Per object: `llm_key` must be present, `vit_key` may be missing (then 0:
// a text-only sample); both must be non-negative integers below 2**31 (-0 is 0). Other fields are checked
// and skipped. Empty text (or only whitespace, or `[]`) gives no records and no error: the caller decides.
LengthRecords parse_length_records(const char* text, size_t size, const std::string& vit_key,
                                   const std::string& llm_key);

}  // namespace omnibal
