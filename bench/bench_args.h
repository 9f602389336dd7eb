// Helpers shared by the hand-run benchmarks: the `--reps N` command line and best-of-N timing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mt::bench {

// `[--reps N]`: N (at least 1), `fallback` without the flag, or -1 after printing the usage
// (the caller exits with status 2).
inline int parse_reps(int argc, char** argv, int fallback) {
  int reps = fallback;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
      return -1;
    }
  }
  return reps;
}

// The fastest of `reps` calls of fn, in milliseconds of wall time (host work only: a device's
// queued work is not waited for).
template <class Fn>
double best_ms(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(
        best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
  }
  return best;
}

}  // namespace mt::bench
