#include "train/metrics/svg_plot.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "runtime/core/error.h"

namespace mt::train {

namespace {
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kMarkerMaxPoints = 30;

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 forbids most control characters even when escaped.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string num(double v) {  // coordinates
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

// The nice number nearest to x among 1, 2, 5 x 10^k (the tick step).
double nice_number(double x) {
  const double e = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, e);
  const double nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  return nf * std::pow(10.0, e);
}

// Tick label with as many decimals as the tick step needs.
std::string tick_label(double v, double step) {
  const int decimals = std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
  if (std::fabs(v) < step * 1e-9) v = 0.0;  // no "-0.0"
  char buf[48];
  const double a = std::fabs(v);
  if (a >= 1e6 || (a != 0 && a < 1e-4)) {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.*f", std::min(decimals, 6), v);
  }
  return buf;
}
}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0.0, 1.0};
  if (lo > hi) std::swap(lo, hi);
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(lo))) {  // flat: widen around the value
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  target = std::max(target, 2);
  const double step = nice_number((hi - lo) / (target - 1));
  const double first = std::floor(lo / step) * step;
  const double last = std::ceil(hi / step) * step;
  std::vector<double> ticks;
  for (int64_t i = 0;; ++i) {
    const double t = first + double(i) * step;  // no accumulated rounding
    ticks.push_back(t);
    if (t >= last - step * 1e-9 || ticks.size() > 100) break;
  }
  return ticks;
}

std::string render_svg_line_chart(const std::vector<PlotSeries>& series,
                                  const PlotOptions& options) {
  MT_CHECK(options.width >= 200 && options.height >= 150,
           "render_svg_line_chart: width and height must be at least 200x150, got ", options.width,
           "x", options.height);
  const double w = options.width, h = options.height;
  const double left = 70, right = 20, top = 40, bottom = 50;
  const double pw = w - left - right, ph = h - top - bottom;

  // Data bounds over finite points.
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin;
  double ymin = xmin, ymax = -xmin;
  for (const PlotSeries& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  }
  const std::vector<double> xt = nice_ticks(xmin, xmax);
  const std::vector<double> yt = nice_ticks(ymin, ymax);
  const double x0 = xt.front(), x1 = xt.back(), y0 = yt.front(), y1 = yt.back();
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1.0;
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1.0;
  const auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  const auto py = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << options.width << "\" height=\""
    << options.height << "\" viewBox=\"0 0 " << options.width << " " << options.height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << options.width << "\" height=\"" << options.height
    << "\" fill=\"white\"/>\n"
    << "<text x=\"" << num(w / 2) << "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">"
    << xml_escape(options.title) << "</text>\n";

  // Grid, ticks and tick labels.
  o << "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (double t : xt) {
    o << "<line x1=\"" << num(px(t)) << "\" y1=\"" << num(top) << "\" x2=\"" << num(px(t))
      << "\" y2=\"" << num(top + ph) << "\"/>\n";
  }
  for (double t : yt) {
    o << "<line x1=\"" << num(left) << "\" y1=\"" << num(py(t)) << "\" x2=\"" << num(left + pw)
      << "\" y2=\"" << num(py(t)) << "\"/>\n";
  }
  o << "</g>\n<g fill=\"#333333\">\n";
  for (double t : xt) {
    o << "<text x=\"" << num(px(t)) << "\" y=\"" << num(top + ph + 18)
      << "\" text-anchor=\"middle\">" << tick_label(t, xstep) << "</text>\n";
  }
  for (double t : yt) {
    o << "<text x=\"" << num(left - 8) << "\" y=\"" << num(py(t) + 4) << "\" text-anchor=\"end\">"
      << tick_label(t, ystep) << "</text>\n";
  }
  o << "</g>\n";
  // Axes and their labels.
  o << "<g stroke=\"#333333\" stroke-width=\"1\">\n"
    << "<line x1=\"" << num(left) << "\" y1=\"" << num(top + ph) << "\" x2=\"" << num(left + pw)
    << "\" y2=\"" << num(top + ph) << "\"/>\n"
    << "<line x1=\"" << num(left) << "\" y1=\"" << num(top) << "\" x2=\"" << num(left) << "\" y2=\""
    << num(top + ph) << "\"/>\n</g>\n"
    << "<text x=\"" << num(left + pw / 2) << "\" y=\"" << num(h - 10)
    << "\" text-anchor=\"middle\">" << xml_escape(options.x_label) << "</text>\n"
    << "<text x=\"16\" y=\"" << num(top + ph / 2)
    << "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " << num(top + ph / 2) << ")\">"
    << xml_escape(options.y_label) << "</text>\n";

  // Series.
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kPalette[i % std::size(kPalette)];
    std::vector<std::pair<double, double>> pts;
    for (const auto& [x, y] : series[i].points) {
      if (std::isfinite(x) && std::isfinite(y)) pts.emplace_back(px(x), py(y));
    }
    if (pts.empty()) continue;
    o << "<polyline fill=\"none\" stroke=\"" << color
      << "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"";
    for (size_t k = 0; k < pts.size(); ++k) {
      o << (k ? " " : "") << num(pts[k].first) << "," << num(pts[k].second);
    }
    o << "\"/>\n";
    if (pts.size() <= kMarkerMaxPoints) {
      o << "<g fill=\"" << color << "\">\n";
      for (const auto& [x, y] : pts) {
        o << "<circle cx=\"" << num(x) << "\" cy=\"" << num(y) << "\" r=\"2.5\"/>\n";
      }
      o << "</g>\n";
    }
  }

  // Legend (top right, inside the plot area).
  if (!series.empty()) {
    size_t longest = 0;
    for (const PlotSeries& s : series) longest = std::max(longest, s.name.size());
    const double lw = 40 + 7.0 * double(longest), lh = 8 + 18.0 * double(series.size());
    const double lx = left + pw - lw - 8, ly = top + 8;
    o << "<g class=\"legend\">\n<rect x=\"" << num(lx) << "\" y=\"" << num(ly) << "\" width=\""
      << num(lw) << "\" height=\"" << num(lh)
      << "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#cccccc\"/>\n";
    for (size_t i = 0; i < series.size(); ++i) {
      const double yy = ly + 16 + 18.0 * double(i);
      o << "<line x1=\"" << num(lx + 8) << "\" y1=\"" << num(yy - 4) << "\" x2=\"" << num(lx + 28)
        << "\" y2=\"" << num(yy - 4) << "\" stroke=\"" << kPalette[i % std::size(kPalette)]
        << "\" stroke-width=\"2\"/>\n<text x=\"" << num(lx + 34) << "\" y=\"" << num(yy) << "\">"
        << xml_escape(series[i].name) << "</text>\n";
    }
    o << "</g>\n";
  }
  o << "</svg>\n";
  return o.str();
}

void write_svg_line_chart(const std::string& path, const std::vector<PlotSeries>& series,
                          const PlotOptions& options) {
  const std::string svg = render_svg_line_chart(series, options);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  MT_CHECK(f.good(), "write_svg_line_chart: cannot open '", path,
           "' for writing: ", std::strerror(errno));
  f << svg;
  f.close();
  MT_CHECK(!f.fail(), "write_svg_line_chart: cannot write '", path, "'");
}

}  // namespace mt::train
