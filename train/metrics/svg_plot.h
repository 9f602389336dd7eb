// A self-contained SVG line chart (no dependencies), for loss.svg in the dump folder: several
// named series of (x, y) points (e.g. "loss" and "val_loss" against step) with axes, grid lines,
// ticks at "nice" numbers (1, 2, 5 x 10^k), a legend, a title and axis labels. Linear axes only.
//
// Each series with at least one finite point is drawn as one <polyline> holding its finite points
// in the given order (NaN/inf points are skipped), plus circle markers when it has few points
// (<= 30), so a validation series with one point is still visible. Colours cycle through the
// matplotlib "tab10" palette. All text is XML-escaped.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mt::train {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y)
};

struct PlotOptions {
  std::string title = "loss";
  std::string x_label = "step";
  std::string y_label = "loss";
  int width = 800;
  int height = 450;
};

// Tick positions covering [lo, hi] at a nice step (about `target` ticks): the first tick <= lo,
// the last >= hi. lo == hi is widened; non-finite input gives {0, 1}.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

// The SVG document.
std::string render_svg_line_chart(const std::vector<PlotSeries>& series,
                                  const PlotOptions& options = {});
// Writes it to `path` (throws mt::Error naming the path).
void write_svg_line_chart(const std::string& path, const std::vector<PlotSeries>& series,
                          const PlotOptions& options = {});

}  // namespace mt::train
