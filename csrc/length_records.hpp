// A fast reader of per-sample length records: a JSON list of objects, or JSON Lines (one object per line),
// from which a few fields are taken per object. No Python objects per sample, one pass over the bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace omnibal {

// The keys read from every object (compared with their escapes decoded); other keys are checked and skipped.
struct RecordKeys {
  std::string vit = "vit_num";              // the ViT load, a count
  std::string llm = "token_num";            // the LLM load, a count (required)
  std::string vit_seqlens = "vit_seqlens";  // the ViT sequence lengths (per image, frame group or tile), a list
  std::string label = "label_num";          // the trained label tokens, a count
};

struct LengthRecords {
  // One entry per record.
  std::vector<int64_t> vit;
  std::vector<int64_t> llm;
  // The ViT sequence lengths, CSR: record i's are vit_seqlens[vit_seqlens_offsets[i] .. vit_seqlens_offsets[i+1]).
  // Filled only when some record has the key (has_vit_seqlens; else all three are empty). A record without
  // it has an empty run and vit_seqlens_given[i] == 0; an empty list in the file is an empty run with 1.
  bool has_vit_seqlens = false;
  std::vector<int64_t> vit_seqlens;
  std::vector<int64_t> vit_seqlens_offsets;  // num_records + 1, from 0
  std::vector<uint8_t> vit_seqlens_given;
  // The label token counts, -1 where a record has none. Filled only when some record has the key (has_label).
  bool has_label = false;
  std::vector<int64_t> label;
  // Empty on success; otherwise what went wrong and where, and at which record (error_sample, -1 if none).
  std::string error;
  int64_t error_sample = -1;
};

// Reads `text`: one JSON array of objects (nothing but whitespace after its ']'), or JSON Lines (objects
// separated by newlines). The grammar is strict JSON (commas between items, no trailing commas) and the text
// strict UTF-8 everywhere, skipped fields included. Per object:
// - `keys.llm` must be present; counts (`keys.vit`, `keys.llm`, `keys.label`) are non-negative integers below
//   2**31 (-0 is 0). A missing `keys.vit` is 0 (a text-only sample) unless `keys.vit_seqlens` is given.
// - `keys.vit_seqlens` is a flat list of counts that sums to `keys.vit`; without `keys.vit`, the sum is the
//   ViT load (below 2**31).
// - `keys.label` is at most `keys.llm` (the labels are among the sample's tokens).
// Where a key repeats in one object its last value counts (as in Python's json). Errors name the line and
// column (columns count characters) and quote values without cutting a character. Empty text (or only
// whitespace, or `[]`) gives no records and no error: the caller decides.
LengthRecords parse_length_records(const char* text, size_t size, const RecordKeys& keys);

}  // namespace omnibal
