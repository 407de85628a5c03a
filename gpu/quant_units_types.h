// The per-type units of gpu/quant_units.h (included from there): load, dot
// and dequantise for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K in the
// device layout. Bit layouts as src/model/quants.cpp (dequantize_row), the
// integer dot products after ggml-cuda's vecdotq.cuh.
//
// dot(w, x, k) is dot(prep(w, k), x): prep decodes what does not depend on
// the activations (the 4- to 6-bit codes as signed bytes, the sub-block
// scales and mins) once, so a kernel that multiplies one unit with several
// tokens decodes it once; the arithmetic is the same for one token or many.
#pragma once

namespace topkv::qunits {

// ---- Q8_0: two units of 16 values per block ------------------------------------
struct Q8_0U {
  static constexpr GgmlType kType = GgmlType::Q8_0;
  static constexpr int kValues = 32, kUnits = 2, kRuns = 1;
  struct Unit {
    I4 q;
    float d;
  };
  TOPKV_HD static Unit load(const QuantMatrix& m, int64_t g, int k) {
    return Unit{LoadWeight::i4(m.plane[0] + g * 32 + 16 * k), half_to_float(LoadWeight::u16(m.plane[1] + g * 2))};
  }
  template <int S = 1> TOPKV_HD static XUnit load_x(const Q8Row& x, int64_t b, int k) {
    XUnit u;
    load_x_run<S>(x, b, k, u.a, u.a2, u.da, u.sa);
    u.b = u.a, u.db = u.da, u.sb = u.sa;
    if constexpr (S == 2) u.b2 = u.a2;
    return u;
  }
  using Prep = Unit;
  TOPKV_HD static Prep prep(const Unit& w, int) { return w; }
  template <int S = 1> TOPKV_HD static float dot(const Prep& w, const XUnit& x) {
    return fmul(w.d, fmul(x.da, (float)dot16s<S>(w.q.v, x.a, x.a2)));
  }
  template <int S = 1> TOPKV_HD static float dot(const Unit& w, const XUnit& x, int k) { return dot<S>(prep(w, k), x); }
  TOPKV_HD static int run_offset(int k, int) { return 16 * k; }
  TOPKV_HD static void dequant(const Unit& w, int, float* out) {  // y = d * q
    TOPKV_UNROLL
    for (int j = 0; j < 16; ++j) out[j] = fmul(w.d, (float)byte_of(w.q.v[j / 4], j % 4));
  }
};

// ---- legacy 4/5-bit types: one unit per block, run 0 = low nibbles (values
// 0..15), run 1 = high nibbles (16..31) -------------------------------------------
// The 4-bit codes of run r, word i (values 16r + 4i .. +3), with the 5th bits
// of Q5_x added from qh (bit j of qh belongs to value j).
TOPKV_HD int legacy_codes(const I4& q, int i, int r) {
  return r == 0 ? lo_nibbles(q.v[i]) : hi_nibbles(q.v[i]);
}
TOPKV_HD int legacy_codes5(const I4& q, uint32_t qh, int i, int r) {
  return legacy_codes(q, i, r) | fifth_bits(qh >> (16 * r + 4 * i));
}
template <int S> TOPKV_HD XUnit load_x_legacy(const Q8Row& x, int64_t b) {
  XUnit u;
  load_x_run<S>(x, b, 0, u.a, u.a2, u.da, u.sa);
  u.b = LoadAct::i4(x.qs + b * 32 + 16);
  if constexpr (S == 2) u.b2 = LoadAct::i4(x.lo + b * 32 + 16);
  u.db = u.da, u.sb = u.sa;
  return u;
}
// The code of value j (0..15) of run r as dequantize_row reads it.
TOPKV_HD int legacy_code_at(const I4& q, int r, int j) {
  const int byte = ubyte_of(q.v[j / 4], j % 4);
  return r == 0 ? (byte & 15) : (byte >> 4);
}

template <bool kFifth, bool kMin>
struct LegacyU {
  static constexpr int kValues = 32, kUnits = 1, kRuns = 2;
  struct Unit {
    I4 q;
    uint32_t qh;
    float d, m;
  };
  // Plane 1 holds qh (5-bit types) or (d, m); the scales are in the last plane.
  TOPKV_HD static Unit load(const QuantMatrix& m, int64_t g, int) {
    Unit u;
    u.q = LoadWeight::i4(m.plane[0] + g * 16);
    u.qh = kFifth ? LoadWeight::u32(m.plane[1] + g * 4) : 0u;
    const uint8_t* sc = kFifth ? m.plane[2] : m.plane[1];
    if (kMin) {
      const uint32_t dm = LoadWeight::u32(sc + g * 4);
      u.d = half_to_float((uint16_t)(dm & 0xffffu)), u.m = half_to_float((uint16_t)(dm >> 16));
    } else {
      u.d = half_to_float(LoadWeight::u16(sc + g * 2)), u.m = 0.f;
    }
    return u;
  }
  template <int S = 1> TOPKV_HD static XUnit load_x(const Q8Row& x, int64_t b, int) { return load_x_legacy<S>(x, b); }
  struct Prep {
    int lo[4], hi[4];  // codes of runs 0 and 1, four per word
    float d, m;
  };
  TOPKV_HD static Prep prep(const Unit& w, int) {
    Prep p;
    TOPKV_UNROLL
    for (int i = 0; i < 4; ++i) {
      p.lo[i] = kFifth ? legacy_codes5(w.q, w.qh, i, 0) : legacy_codes(w.q, i, 0);
      p.hi[i] = kFifth ? legacy_codes5(w.q, w.qh, i, 1) : legacy_codes(w.q, i, 1);
    }
    p.d = w.d, p.m = w.m;
    return p;
  }
  // Q4_0 / Q5_0: y = d (q - 8 | 16), so sum y x8 = d (d8 sum q q8 - 8|16 s8);
  // Q4_1 / Q5_1: y = d q + m, so sum y x8 = d d8 sum q q8 + m s8.
  template <int S = 1> TOPKV_HD static float dot(const Prep& w, const XUnit& x) {
    const int s = dot16s<S>(w.lo, x.a, x.a2) + dot16s<S>(w.hi, x.b, x.b2);  // integers: any order
    const float sum = fmul(x.da, (float)s);
    if (kMin) return fadd(fmul(w.d, sum), fmul(w.m, x.sa));
    return fmul(w.d, fsub(sum, fmul(kFifth ? 16.f : 8.f, x.sa)));
  }
  template <int S = 1> TOPKV_HD static float dot(const Unit& w, const XUnit& x, int k) { return dot<S>(prep(w, k), x); }
  TOPKV_HD static int run_offset(int, int r) { return 16 * r; }
  TOPKV_HD static void dequant(const Unit& w, int, float* out) {
    TOPKV_UNROLL
    for (int r = 0; r < 2; ++r)
      TOPKV_UNROLL
      for (int j = 0; j < 16; ++j) {
        int q = legacy_code_at(w.q, r, j);
        if (kFifth) q |= (int)((w.qh >> (16 * r + j)) & 1u) << 4;
        out[16 * r + j] = kMin ? fadd(fmul(w.d, (float)q), w.m) : fmul(w.d, (float)(q - (kFifth ? 16 : 8)));
      }
  }
};
struct Q4_0U : LegacyU<false, false> { static constexpr GgmlType kType = GgmlType::Q4_0; };
struct Q4_1U : LegacyU<false, true> { static constexpr GgmlType kType = GgmlType::Q4_1; };
struct Q5_0U : LegacyU<true, false> { static constexpr GgmlType kType = GgmlType::Q5_0; };
struct Q5_1U : LegacyU<true, true> { static constexpr GgmlType kType = GgmlType::Q5_1; };

// ---- Q4_K / Q5_K: 8 units per super-block -----------------------------------------
// Unit k = 2c + h reads qs[32c + 16h .. +16]: low nibbles are values 16h + j
// of sub-block 2c (run 0), high nibbles those of sub-block 2c + 1 (run 1).
// Header (the block's first 16 bytes): d, dmin, then 12 bytes of 6-bit
// scales and mins (unpack_scale_min_k4), read as 16-bit words as vecdotq.cuh
// does: for c < 2 the pair (scale 2c, 2c+1) is word c & 0x3f3f and the mins
// word c+2; for c >= 2 the low 4 bits come from word c+2 and the top 2 from
// words c-2 (scales) and c (mins).
TOPKV_HD uint32_t k4_word(const I4& hdr, int i) {  // 16-bit word i (0..5) of the 12 scale bytes
  const uint32_t w = i < 2 ? hdr.v[1] : i < 4 ? hdr.v[2] : hdr.v[3];
  return (w >> (16 * (i & 1))) & 0xffffu;
}
struct K4Scales {
  int sc_lo, sc_hi, m_lo, m_hi;  // sub-blocks 2c (run 0) and 2c + 1 (run 1)
  float d, dmin;
};
TOPKV_HD K4Scales k4_scales(const I4& hdr, int c) {
  uint32_t sc2, m2;
  if (c < 2) {
    sc2 = k4_word(hdr, c) & 0x3f3fu;
    m2 = k4_word(hdr, c + 2) & 0x3f3fu;
  } else {
    sc2 = (k4_word(hdr, c + 2) & 0x0f0fu) | ((k4_word(hdr, c - 2) & 0xc0c0u) >> 2);
    m2 = ((k4_word(hdr, c + 2) >> 4) & 0x0f0fu) | ((k4_word(hdr, c) & 0xc0c0u) >> 2);
  }
  K4Scales s;
  s.sc_lo = (int)(sc2 & 0xffu), s.sc_hi = (int)(sc2 >> 8), s.m_lo = (int)(m2 & 0xffu), s.m_hi = (int)(m2 >> 8);
  s.d = half_to_float((uint16_t)(hdr.v[0] & 0xffffu)), s.dmin = half_to_float((uint16_t)(hdr.v[0] >> 16));
  return s;
}

template <bool kFifth>
struct K45U {
  static constexpr int kValues = 256, kUnits = 8, kRuns = 2;
  static constexpr int kBlockBytes = kFifth ? 176 : 144, kQsOffset = kFifth ? 48 : 16;
  struct Unit {
    I4 hdr, qh, q;
  };
  TOPKV_HD static Unit load(const QuantMatrix& m, int64_t g, int k) {
    const uint8_t* blk = m.plane[0] + g * kBlockBytes;
    Unit u;
    u.hdr = LoadWeight::i4(blk);
    u.q = LoadWeight::i4(blk + kQsOffset + 16 * k);
    if (kFifth)
      u.qh = LoadWeight::i4(blk + 16 + 16 * (k & 1));
    else
      u.qh = I4{{0u, 0u, 0u, 0u}};
    return u;
  }
  template <int S = 1> TOPKV_HD static XUnit load_x(const Q8Row& x, int64_t b, int k) {
    const int c = k >> 1, h = k & 1;
    XUnit u;
    load_x_run<S>(x, 8 * b + 2 * c, h, u.a, u.a2, u.da, u.sa);
    load_x_run<S>(x, 8 * b + 2 * c + 1, h, u.b, u.b2, u.db, u.sb);
    return u;
  }
  // Codes of word i of run r (5th bit: bit 2c + r of qh[16h + 4i + byte]).
  TOPKV_HD static int codes(const Unit& w, int c, int i, int r) {
    int q = r == 0 ? lo_nibbles(w.q.v[i]) : hi_nibbles(w.q.v[i]);
    if (kFifth) q |= (int)(((w.qh.v[i] >> (2 * c + r)) & 0x01010101u) << 4);
    return q;
  }
  struct Prep {
    int lo[4], hi[4];  // codes of runs 0 and 1
    int sc_lo, sc_hi;
    float m_lo, m_hi, d, dmin;
    bool mins;  // h == 0: this unit adds the min terms
  };
  TOPKV_HD static Prep prep(const Unit& w, int k) {
    const int c = k >> 1;
    const K4Scales s = k4_scales(w.hdr, c);
    Prep p;
    TOPKV_UNROLL
    for (int i = 0; i < 4; ++i) p.lo[i] = codes(w, c, i, 0), p.hi[i] = codes(w, c, i, 1);
    p.sc_lo = s.sc_lo, p.sc_hi = s.sc_hi, p.m_lo = (float)s.m_lo, p.m_hi = (float)s.m_hi;
    p.d = s.d, p.dmin = s.dmin, p.mins = (k & 1) == 0;
    return p;
  }
  // y = d sc q - dmin m per sub-block, so sum y x8 = d (sc_lo d8a sum_lo +
  // sc_hi d8b sum_hi) - dmin (m_lo s8a + m_hi s8b); the min terms cover the
  // whole 32-value q8 blocks, so only the unit with h = 0 adds them (the
  // other lanes compute and drop them: a select, no branch).
  template <int S = 1> TOPKV_HD static float dot(const Prep& w, const XUnit& x) {
    const int lo = dot16s<S>(w.lo, x.a, x.a2), hi = dot16s<S>(w.hi, x.b, x.b2);
    const float r = fmul(w.d, fadd(fmul(x.da, (float)(lo * w.sc_lo)), fmul(x.db, (float)(hi * w.sc_hi))));
    const float mins = fmul(w.dmin, fadd(fmul(w.m_lo, x.sa), fmul(w.m_hi, x.sb)));
    return w.mins ? fsub(r, mins) : r;
  }
  template <int S = 1> TOPKV_HD static float dot(const Unit& w, const XUnit& x, int k) { return dot<S>(prep(w, k), x); }
  TOPKV_HD static int run_offset(int k, int r) { return 64 * (k >> 1) + 32 * r + 16 * (k & 1); }
  TOPKV_HD static void dequant(const Unit& w, int k, float* out) {  // y = (d sc) q - dmin m
    const int c = k >> 1;
    const K4Scales s = k4_scales(w.hdr, c);
    TOPKV_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float ds = fmul(s.d, (float)(r == 0 ? s.sc_lo : s.sc_hi));
      const float mm = fmul(s.dmin, (float)(r == 0 ? s.m_lo : s.m_hi));
      TOPKV_UNROLL
      for (int i = 0; i < 4; ++i) {
        const uint32_t q4 = (uint32_t)codes(w, c, i, r);
        TOPKV_UNROLL
        for (int e = 0; e < 4; ++e) out[16 * r + 4 * i + e] = fsub(fmul(ds, (float)ubyte_of(q4, e)), mm);
      }
    }
  }
};
struct Q4_KU : K45U<false> { static constexpr GgmlType kType = GgmlType::Q4_K; };
struct Q5_KU : K45U<true> { static constexpr GgmlType kType = GgmlType::Q5_K; };

// ---- Q6_K: 8 units per super-block ---------------------------------------------------
// Unit k = 4h + 2p + s reads ql[64h + 32p + 16s .. +16] and qh[32h + 16s ..
// +16]: low nibbles + qh bits 2p, 2p+1 are values 128h + 32p + 16s + j (run
// 0, scale 8h + s + 2p), high nibbles + qh bits 2p+4, 2p+5 are values
// 128h + 64 + 32p + 16s + j (run 1, scale 8h + s + 2p + 4); codes minus 32.
struct Q6_KU {
  static constexpr GgmlType kType = GgmlType::Q6_K;
  static constexpr int kValues = 256, kUnits = 8, kRuns = 2;
  struct Unit {
    I4 ql, qh;
    uint32_t sc_lo4, sc_hi4;  // scales 8h..8h+3 and 8h+4..8h+7
    float d;
  };
  TOPKV_HD static Unit load(const QuantMatrix& m, int64_t g, int k) {
    const int h = k >> 2, s = k & 1;
    const uint8_t* blk = m.plane[0] + g * 208;
    Unit u;
    u.ql = LoadWeight::i4(blk + 16 * k);
    u.qh = LoadWeight::i4(blk + 128 + 32 * h + 16 * s);
    LoadWeight::u2(blk + 192 + 8 * h, u.sc_lo4, u.sc_hi4);
    u.d = half_to_float(LoadWeight::u16(m.plane[1] + g * 2));
    return u;
  }
  template <int S = 1> TOPKV_HD static XUnit load_x(const Q8Row& x, int64_t b, int k) {
    const int h = k >> 2, p = (k >> 1) & 1, s = k & 1;
    XUnit u;
    load_x_run<S>(x, 8 * b + 4 * h + p, s, u.a, u.a2, u.da, u.sa);
    load_x_run<S>(x, 8 * b + 4 * h + 2 + p, s, u.b, u.b2, u.db, u.sb);
    return u;
  }
  TOPKV_HD static int codes(const Unit& w, int p, int i, int r) {  // signed bytes, code - 32
    const int q4 = r == 0 ? lo_nibbles(w.ql.v[i]) : hi_nibbles(w.ql.v[i]);
    const int q2 = (int)(((w.qh.v[i] >> (2 * p + 4 * r)) & 0x03030303u) << 4);
    return minus32(q4 | q2);
  }
  struct Prep {
    int lo[4], hi[4];  // codes - 32 of runs 0 and 1
    int sc_lo, sc_hi;
    float d;
  };
  TOPKV_HD static Prep prep(const Unit& w, int k) {
    const int p = (k >> 1) & 1, s = k & 1;
    Prep r;
    TOPKV_UNROLL
    for (int i = 0; i < 4; ++i) r.lo[i] = codes(w, p, i, 0), r.hi[i] = codes(w, p, i, 1);
    r.sc_lo = byte_of(w.sc_lo4, s + 2 * p), r.sc_hi = byte_of(w.sc_hi4, s + 2 * p), r.d = w.d;
    return r;
  }
  template <int S = 1> TOPKV_HD static float dot(const Prep& w, const XUnit& x) {
    const int lo = dot16s<S>(w.lo, x.a, x.a2), hi = dot16s<S>(w.hi, x.b, x.b2);
    return fmul(w.d, fadd(fmul(x.da, (float)(lo * w.sc_lo)), fmul(x.db, (float)(hi * w.sc_hi))));
  }
  template <int S = 1> TOPKV_HD static float dot(const Unit& w, const XUnit& x, int k) { return dot<S>(prep(w, k), x); }
  TOPKV_HD static int run_offset(int k, int r) {
    return 128 * (k >> 2) + 64 * r + 32 * ((k >> 1) & 1) + 16 * (k & 1);
  }
  TOPKV_HD static void dequant(const Unit& w, int k, float* out) {  // y = (d sc) q
    const int p = (k >> 1) & 1, s = k & 1;
    TOPKV_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float dsc = fmul(w.d, (float)byte_of(r == 0 ? w.sc_lo4 : w.sc_hi4, s + 2 * p));
      TOPKV_UNROLL
      for (int i = 0; i < 4; ++i) {
        const uint32_t q = (uint32_t)codes(w, p, i, r);
        TOPKV_UNROLL
        for (int e = 0; e < 4; ++e) out[16 * r + 4 * i + e] = fmul(dsc, (float)byte_of(q, e));
      }
    }
  }
};

// Calls f(U{}) with U the unit type of t; returns false for a type without a
// device layout.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class F> TOPKV_HD bool with_unit_type(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::Q8_0: f(Q8_0U{}); return true;
    case GgmlType::Q4_0: f(Q4_0U{}); return true;
    case GgmlType::Q4_1: f(Q4_1U{}); return true;
    case GgmlType::Q5_0: f(Q5_0U{}); return true;
    case GgmlType::Q5_1: f(Q5_1U{}); return true;
    case GgmlType::Q4_K: f(Q4_KU{}); return true;
    case GgmlType::Q5_K: f(Q5_KU{}); return true;
    case GgmlType::Q6_K: f(Q6_KU{}); return true;
    default: return false;
  }
}

}  // namespace topkv::qunits
