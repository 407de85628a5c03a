// UTF-8 coding and the character classes of unicode.h.
#include "src/model/unicode.h"

#include <algorithm>

namespace topkv {

namespace {

bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

// Bytes a sequence starting with `lead` must have (0: never a lead byte), and
// the allowed range of the second byte (RFC 3629 table: rules out overlongs,
// surrogates and code points past U+10FFFF).
struct LeadInfo {
  uint32_t len;
  uint8_t lo2, hi2;
};
LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

bool in_ranges(const unicode_detail::CodepointRange* r, size_t n, uint32_t cp) {
  const auto* end = r + n;
  const auto* it = std::upper_bound(r, end, cp, [](uint32_t c, const auto& x) { return c < x.lo; });
  return it != r && cp <= (it - 1)->hi;
}

}  // namespace

Utf8Char utf8_decode(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {b0, 1, true};
  const LeadInfo li = lead_info(b0);
  const Utf8Char bad{0xDC00u + b0, 1, false};
  if (li.len == 0 || avail < li.len || p[1] < li.lo2 || p[1] > li.hi2) return bad;
  for (uint32_t k = 2; k < li.len; ++k)
    if (!is_cont(p[k])) return bad;
  uint32_t cp = b0 & (0x7F >> li.len);
  for (uint32_t k = 1; k < li.len; ++k) cp = (cp << 6) | (p[k] & 0x3F);
  return {cp, li.len, true};
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

size_t utf8_complete_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  // The only bytes worth holding back are a lead byte among the last three,
  // followed by nothing but valid continuation bytes that do not finish it.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    if (is_cont(p[start])) continue;  // keep looking for the lead
    const LeadInfo li = lead_info(p[start]);
    if (li.len <= back) return n;  // ASCII, not a lead, or already complete
    if (back >= 2 && (p[start + 1] < li.lo2 || p[start + 1] > li.hi2)) return n;  // can never complete
    return start;
  }
  return n;
}

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(unicode_detail::kLetterRanges, unicode_detail::kLetterRanges_count, cp);
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(unicode_detail::kNumberRanges, unicode_detail::kNumberRanges_count, cp);
}

bool is_whitespace(uint32_t cp) {
  // Unicode White_Space (PropList.txt), which is what \s means in the regex
  // engines the tokenizers were defined with (Oniguruma, Rust regex).
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace topkv
