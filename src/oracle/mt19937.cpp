// MT19937 seeding and jump-ahead. See mt19937.hpp for the method.
//
// The characteristic polynomial p of the one-step map is found once per process by Berlekamp-Massey on
// 2 x 19,937 bits of one output stream (it does not depend on the seed), as a GF(2) polynomial packed in
// 64-bit words.
#include "oracle/mt19937.hpp"

#include <mutex>
#include <vector>

namespace clairfs {

namespace {

constexpr int kDegree = 19937;

// A GF(2) polynomial: bit i of the vector is the coefficient of x^i.
using Poly = std::vector<uint64_t>;

bool bit(const Poly& p, size_t i) { return i / 64 < p.size() && ((p[i / 64] >> (i % 64)) & 1u); }
void flip(Poly& p, size_t i) {
  if (i / 64 >= p.size()) p.resize(i / 64 + 1, 0);
  p[i / 64] ^= uint64_t{1} << (i % 64);
}

// Berlekamp-Massey over GF(2): the shortest connection polynomial C (C[0] = 1) of the bit sequence s,
// s[j] = sum_{i=1..L} C[i] s[j-i]. Returns C and sets L.
Poly berlekamp_massey(const std::vector<uint8_t>& s, int* length) {
  const size_t n = s.size();
  const size_t words = n / 64 + 2;
  Poly c(words, 0), b(words, 0), h(words, 0);  // h: bit i is s[j - i], the history against c
  c[0] = b[0] = 1;
  int l = 0;
  long m = -1;
  for (size_t j = 0; j < n; ++j) {
    for (size_t w = words; w-- > 1;) h[w] = (h[w] << 1) | (h[w - 1] >> 63);
    h[0] = (h[0] << 1) | s[j];
    // discrepancy: parity of sum_{i=0..l} c[i] s[j-i]
    uint64_t acc = 0;
    for (size_t w = 0; w <= static_cast<size_t>(l) / 64; ++w) acc ^= c[w] & h[w];
    if (!(__builtin_popcountll(acc) & 1)) continue;
    Poly t = c;
    const size_t shift = j - static_cast<size_t>(m);
    const size_t ws = shift / 64, bs = shift % 64;
    for (size_t w = 0; w + ws < words; ++w) {
      c[w + ws] ^= b[w] << bs;
      if (bs && w + ws + 1 < words) c[w + ws + 1] ^= b[w] >> (64 - bs);
    }
    if (2 * l <= static_cast<int>(j)) {
      l = static_cast<int>(j) + 1 - l;
      m = static_cast<long>(j);
      b = std::move(t);
    }
  }
  *length = l;
  return c;
}

struct CharPoly {
  Poly p;  // degree kDegree, monic
};

const CharPoly& char_poly() {
  static CharPoly cp;
  static std::once_flag once;
  std::call_once(once, [] {
    Mt19937 g(5489);
    std::vector<uint8_t> bits(2 * kDegree + 64);
    for (auto& b : bits) b = static_cast<uint8_t>(g() & 1u);  // tempering is linear: any output bit works
    int l = 0;
    Poly c = berlekamp_massey(bits, &l);
    // p(x) = x^L + c1 x^(L-1) + ... + cL: the reverse of C.
    cp.p.assign(static_cast<size_t>(l) / 64 + 1, 0);
    for (int i = 0; i <= l; ++i)
      if (bit(c, static_cast<size_t>(i))) flip(cp.p, static_cast<size_t>(l - i));
  });
  return cp;
}

int degree(const Poly& p) {
  for (size_t w = p.size(); w-- > 0;)
    if (p[w]) return static_cast<int>(w * 64 + 63 - static_cast<size_t>(__builtin_clzll(p[w])));
  return -1;
}

// r = r mod p, where p has degree dp and r may have degree up to 2 dp.
void reduce(Poly& r, const Poly& p, int dp) {
  for (int d = degree(r); d >= dp; --d) {
    if (!bit(r, static_cast<size_t>(d))) continue;
    const size_t shift = static_cast<size_t>(d - dp);
    const size_t ws = shift / 64, bs = shift % 64;
    for (size_t w = 0; w < p.size(); ++w) {
      if (!p[w]) continue;
      r[w + ws] ^= p[w] << bs;
      if (bs && w + ws + 1 < r.size()) r[w + ws + 1] ^= p[w] >> (64 - bs);
    }
  }
}

// x^k mod p.
Poly x_pow_mod(uint64_t k, const Poly& p) {
  const int dp = degree(p);
  const size_t words = static_cast<size_t>(2 * dp) / 64 + 2;
  Poly r(words, 0);
  r[0] = 1;
  for (int b = 63; b >= 0; --b) {
    // square: coefficient i moves to 2i
    Poly sq(words, 0);
    for (int i = degree(r); i >= 0; --i)
      if (bit(r, static_cast<size_t>(i))) sq[static_cast<size_t>(2 * i) / 64] |= uint64_t{1} << ((2 * i) % 64);
    reduce(sq, p, dp);
    r = std::move(sq);
    if ((k >> b) & 1u) {
      // multiply by x
      for (size_t w = r.size(); w-- > 1;) r[w] = (r[w] << 1) | (r[w - 1] >> 63);
      r[0] <<= 1;
      reduce(r, p, dp);
    }
  }
  return r;
}

}  // namespace

Mt19937::Mt19937(uint32_t seed) {
  // init_genrand, then 624 silent steps: MT19937's first output is temper(x[624]).
  x_[0] = seed;
  for (int i = 1; i < kN; ++i) x_[i] = 1812433253u * (x_[i - 1] ^ (x_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  pos_ = 0;
  discard(kN);
}

struct Mt19937Jump {
  static void apply(Mt19937& g, const Poly& r) {
    // Horner: acc = sum_i r_i T^i (state), from the highest coefficient down.
    Mt19937 acc = g;
    for (auto& w : acc.x_) w = 0;
    acc.pos_ = 0;
    for (int i = degree(r); i >= 0; --i) {
      acc.step();
      if (bit(r, static_cast<size_t>(i))) {
        for (int j = 0, a = acc.pos_, s = g.pos_; j < Mt19937::kN; ++j) {
          acc.x_[a] ^= g.x_[s];
          if (++a == Mt19937::kN) a = 0;
          if (++s == Mt19937::kN) s = 0;
        }
      }
    }
    g = acc;
  }
};

void Mt19937::jump(uint64_t count) {
  // Short jumps are cheaper stepped; the crossover is around a few hundred thousand steps.
  if (count < 200000) return discard(count);
  Mt19937Jump::apply(*this, x_pow_mod(count, char_poly().p));
}

}  // namespace clairfs
