// MT19937 as torch's CPU generator runs it (init_genrand seeding, standard tempering), kept in "window"
// form so that it can jump ahead: the state is the 624 words x[k .. k+623] of the recurrence, the next
// output is temper(x[k]), and a step replaces x[k] by x[k+624]. Two states in this form add (XOR) word by
// word, which is what jump() needs.
//
// jump(k) is the polynomial method (Haramoto et al., "Efficient jump ahead for F2-linear random number
// generators", 2008): with p the characteristic polynomial of the one-step map T, T^k = (x^k mod p)(T),
// evaluated on the state by Horner's rule. Cost: ~40 squarings mod p plus 19,937 steps, a few tens of
// milliseconds, whatever k is — so epoch 10,000 costs what epoch 1 does.
#pragma once

#include <cstdint>

namespace clairfs {

class Mt19937 {
 public:
  static constexpr int kN = 624;
  static constexpr int kM = 397;

  explicit Mt19937(uint32_t seed);

  uint32_t operator()() {
    const uint32_t y = x_[pos_];
    step();
    return temper(y);
  }

  // The first output of Mt19937(seed), at a third of the cost of making one (it needs x[0 .. 397] only).
  static uint32_t first_output(uint32_t seed) {
    uint32_t x = seed, x0 = seed, x1 = 0;
    for (uint32_t i = 1; i <= static_cast<uint32_t>(kM); ++i) {
      x = 1812433253u * (x ^ (x >> 30)) + i;
      if (i == 1) x1 = x;
    }
    const uint32_t y = (x0 & 0x80000000u) | (x1 & 0x7fffffffu);
    return temper(x ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u));
  }

  // Leaves the generator as if `count` outputs had been drawn.
  void jump(uint64_t count);
  // The same by drawing them; for tests.
  void discard(uint64_t count) {
    for (uint64_t i = 0; i < count; ++i) step();
  }

 private:
  friend struct Mt19937Jump;
  static uint32_t temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }
  void step() {
    const int p1 = pos_ + 1 == kN ? 0 : pos_ + 1;
    const int pm = pos_ + kM >= kN ? pos_ + kM - kN : pos_ + kM;
    const uint32_t y = (x_[pos_] & 0x80000000u) | (x_[p1] & 0x7fffffffu);
    x_[pos_] = x_[pm] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    pos_ = p1;
  }

  uint32_t x_[kN];
  int pos_ = 0;
};

}  // namespace clairfs
