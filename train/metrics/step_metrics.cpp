#include "train/metrics/step_metrics.h"

#include <cmath>
#include <cstdio>
#include <string_view>

namespace mt::train {

namespace {
// printf into a std::string.
template <class... Args>
std::string fmt(const char* format, Args... args) {
  char buf[128];
  const int n = std::snprintf(buf, sizeof(buf), format, args...);
  return std::string(buf, n < 0 ? 0 : std::min<size_t>(size_t(n), sizeof(buf) - 1));
}

std::string nonfinite(double v) { return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"); }

// Right-aligns `s` in `width` columns (longer strings are kept whole).
std::string pad_left(std::string s, size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

std::string fixed_or_sci(double v, int decimals) {
  if (!std::isfinite(v)) return nonfinite(v);
  const double a = std::fabs(v);
  if (a != 0 && (a < 0.01 || a >= 1e5)) return fmt("%.2e", v);
  return fmt("%.*f", decimals, v);
}
}  // namespace

std::string format_thousands(int64_t value) {
  const bool negative = value < 0;
  // Works on the unsigned magnitude so INT64_MIN is fine.
  uint64_t mag = negative ? uint64_t(0) - uint64_t(value) : uint64_t(value);
  std::string digits = std::to_string(mag);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return negative ? "-" + out : out;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "n/a";
  const int64_t s = int64_t(std::llround(seconds));
  if (s < 60) return fmt("%llds", (long long)s);
  if (s < 3600) return fmt("%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  if (s < 86400) return fmt("%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  return fmt("%lldd%02lldh", (long long)(s / 86400), (long long)(s % 86400 / 3600));
}

std::string format_memory(int64_t in_use, int64_t peak) {
  constexpr double kMiB = 1024.0 * 1024.0, kGiB = kMiB * 1024.0;
  if (double(peak) >= kGiB) return fmt("%.1f/%.1f GiB", in_use / kGiB, peak / kGiB);
  return fmt("%.0f/%.0f MiB", in_use / kMiB, peak / kMiB);
}

int step_width_for(int64_t total_steps) {
  int digits = 1;
  for (int64_t v = total_steps < 0 ? 0 : total_steps; v >= 10; v /= 10) ++digits;
  return digits < 4 ? 4 : digits;
}

std::string rate_name(const StepMetrics& m) {
  return m.rate_in_samples ? "samples_per_sec" : "tokens_per_sec";
}

std::string format_step_line(const StepMetrics& m, int step_width) {
  std::string line = "step " + pad_left(std::to_string(m.step), size_t(step_width));
  line += "  loss " + pad_left(std::isfinite(m.loss) ? fmt("%.4f", m.loss) : nonfinite(m.loss), 7);
  line += "  grad_norm " + pad_left(fixed_or_sci(m.grad_norm, 2), 8);
  line += "  lr " + (std::isfinite(m.lr) ? fmt("%.1e", m.lr) : nonfinite(m.lr));
  const auto rate = [](double r) {
    return std::isfinite(r) ? format_thousands(int64_t(std::llround(r))) : nonfinite(r);
  };
  line += (m.rate_in_samples ? "  samples/s/rank " : "  tok/s/rank ") +
          pad_left(rate(m.tokens_per_sec), 9);
  if (m.ranks > 1) line += "  total " + pad_left(rate(m.tokens_per_sec * double(m.ranks)), 10);
  line += "  mfu " + pad_left(m.mfu ? (std::isfinite(*m.mfu) ? fmt("%.1f%%", *m.mfu * 100.0)
                                                             : nonfinite(*m.mfu))
                                    : "n/a",
                              6);
  const std::string mem = m.mem_in_use_bytes && m.mem_peak_bytes
                              ? format_memory(*m.mem_in_use_bytes, *m.mem_peak_bytes)
                              : "n/a";
  line += "  mem " + pad_left(mem, 13);
  const double data = m.data_wait_fraction;
  line += "  data " + pad_left(std::isfinite(data) ? fmt("%.0f%%", data * 100.0) : "n/a", 4);
  if (m.comm_exposed_fraction) {
    line += "  comm " + pad_left(fmt("%.0f%%", *m.comm_exposed_fraction * 100.0), 4);
  }
  line += "  eta " + (m.eta_sec ? format_duration(*m.eta_sec) : std::string("n/a"));
  // The headline model metrics only: per-layer ones (name with "_layer") go to metrics.jsonl.
  for (const auto& [name, value] : m.model_metrics) {
    if (name.find("_layer") == std::string::npos) line += "  " + name + " " + fmt("%.3f", value);
  }
  return line;
}

}  // namespace mt::train
