#!/usr/bin/env python3
"""Memory bandwidth of this machine by a plain copy: `dst[:] = src` over 512 MiB float32
arrays (numpy memcpy), split over --threads threads (numpy releases the GIL while copying).
Reports GB/s counting read + write bytes (2 x array size per copy), best and median of --reps.

Usage: python3 tools/bench_membw.py --threads 2
"""
import argparse
import json
import statistics
import threading
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    n = a.mib * (1 << 20) // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)
    parts = np.array_split(np.arange(n), a.threads)
    bounds = [(p[0], p[-1] + 1) for p in parts]

    def copy(lo, hi):
        dst[lo:hi] = src[lo:hi]

    rates = []
    for _ in range(a.reps):
        ts = [threading.Thread(target=copy, args=b) for b in bounds]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        s = time.perf_counter() - t
        rates.append(2 * n * 4 / s / 1e9)
    print(json.dumps({"bench": "membw_copy", "mib": a.mib, "threads": a.threads,
                      "gb_per_s_best": max(rates), "gb_per_s_median": statistics.median(rates)}))


if __name__ == "__main__":
    main()
