#!/usr/bin/python3
"""Reference implementation of order=clairfs, clairfs's portable shuffle (docs/order.md), for loaders
that want to compute the order themselves rather than read it from MOUNTPOINT/.clairfs/order.

    clairfs_order.py N SEED EPOCH     -> the permutation of range(N), one index per line
"""
import sys

MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def clairfs_permutation(n, seed, epoch):
    state = (seed & MASK) ^ ((epoch * 0xD1342543DE82EF95) & MASK)
    state, _ = splitmix64(state)
    r = list(range(n))
    for i in range(n, 1, -1):
        # Lemire's unbiased bounded draw: j uniform in [0, i)
        state, x = splitmix64(state)
        m = x * i
        low = m & MASK
        if low < i:
            threshold = (-i % (1 << 64)) % i
            while low < threshold:
                state, x = splitmix64(state)
                m = x * i
                low = m & MASK
        j = m >> 64
        r[i - 1], r[j] = r[j], r[i - 1]
    return r


if __name__ == "__main__":
    n, seed, epoch = (int(a) for a in sys.argv[1:4])
    print("\n".join(map(str, clairfs_permutation(n, seed, epoch))))
