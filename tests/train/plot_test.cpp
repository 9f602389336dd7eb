// The SVG loss plot (train/metrics/svg_plot): nice tick values, the document's structure (one
// polyline per series with its finite points, legend entries, escaped text), and that the file
// parses as XML (python3's xml.dom.minidom when python3 exists; the structure checks always run).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "train/metrics/svg_plot.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// Point counts of the polylines, in document order.
std::vector<size_t> polyline_point_counts(const std::string& svg) {
  std::vector<size_t> out;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) {
    const size_t a = svg.find("points=\"", p) + 8, b = svg.find('"', a);
    std::istringstream in(svg.substr(a, b - a));
    size_t n = 0;
    for (std::string tok; in >> tok;) {
      EXPECT_EQ(count(tok, ","), 1u) << tok;
      ++n;
    }
    out.push_back(n);
  }
  return out;
}

std::vector<double> approx(std::vector<double> v) {
  for (double& x : v) x = std::round(x * 1e9) / 1e9;
  return v;
}

TEST(NiceTicks, Values) {
  EXPECT_THAT(approx(nice_ticks(0, 1000)), ElementsAre(0, 200, 400, 600, 800, 1000));
  EXPECT_THAT(approx(nice_ticks(2.13, 10.87)), ElementsAre(2, 4, 6, 8, 10, 12));
  EXPECT_THAT(approx(nice_ticks(3.31, 3.58)), ElementsAre(3.3, 3.35, 3.4, 3.45, 3.5, 3.55, 3.6));
  EXPECT_THAT(approx(nice_ticks(1, 1)), ElementsAre(0.9, 0.95, 1, 1.05, 1.1));
  EXPECT_THAT(approx(nice_ticks(0, 0)), ElementsAre(-1, -0.5, 0, 0.5, 1));
  EXPECT_THAT(nice_ticks(NAN, 1), ElementsAre(0, 1));
  // Covers the range in every case.
  for (auto [lo, hi] : {std::pair{-7.3, 123.4}, {1e-5, 3e-5}, {0.0, 1e7}}) {
    const auto t = nice_ticks(lo, hi);
    EXPECT_LE(t.front(), lo);
    EXPECT_GE(t.back(), hi);
    EXPECT_GE(t.size(), 3u);
    EXPECT_LE(t.size(), 12u);
  }
}

TEST(SvgPlot, Structure) {
  PlotSeries loss{"loss", {}}, val{"val_loss", {{100, 3.0}, {200, NAN}, {300, 2.5}, {400, 2.2}}};
  for (int s = 1; s <= 400; ++s) loss.points.emplace_back(s, 10.0 / std::sqrt(double(s)));
  PlotOptions o;
  o.title = "debugmodel <fortunes> & co";
  const std::string svg = render_svg_line_chart({loss, val, PlotSeries{"empty", {}}}, o);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_THAT(polyline_point_counts(svg), ElementsAre(400, 3));  // NaN skipped, empty not drawn
  EXPECT_EQ(count(svg, "<circle"), 3u);  // markers only for the short series
  EXPECT_THAT(svg, HasSubstr(">debugmodel &lt;fortunes&gt; &amp; co</text>"));
  EXPECT_THAT(svg, HasSubstr(">val_loss</text>"));
  EXPECT_THAT(svg, HasSubstr(">empty</text>"));  // still in the legend
  EXPECT_THAT(svg, HasSubstr(">step</text>"));
  // x ticks 0..400, y ticks cover 0.5..10.
  EXPECT_THAT(svg, HasSubstr(">400</text>"));
  EXPECT_THAT(svg, HasSubstr(">10</text>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
}

TEST(SvgPlot, WritesFileThatParsesAsXml) {
  const fs::path dir = fs::temp_directory_path() / ("mt_plot_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "loss.svg";
  PlotSeries loss{"loss", {}}, val{"val loss", {{50, 4.0}, {100, 3.5}}};
  for (int s = 0; s < 120; ++s) loss.points.emplace_back(s, 5.0 - 0.01 * s);
  write_svg_line_chart(path.string(), {loss, val});
  std::ifstream f(path);
  std::stringstream buf;
  buf << f.rdbuf();
  EXPECT_THAT(polyline_point_counts(buf.str()), ElementsAre(120, 2));
  if (std::system("python3 -c 'import xml.dom.minidom' >/dev/null 2>&1") == 0) {
    const std::string cmd =
        "python3 -c 'import sys, xml.dom.minidom as m\n"
        "d = m.parse(sys.argv[1])\n"
        "c = [len(p.getAttribute(\"points\").split()) for p in "
        "d.getElementsByTagName(\"polyline\")]\n"
        "assert d.documentElement.tagName == \"svg\", d.documentElement.tagName\n"
        "assert c == [120, 2], c' " +
        path.string();
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "python3 rejected " << path;
  } else {
    GTEST_LOG_(INFO) << "python3 not found: XML parse check skipped (structure checked above)";
  }
  fs::remove_all(dir);
}

TEST(SvgPlot, Errors) {
  try {
    write_svg_line_chart("/nonexistent_dir_mt/loss.svg", {});
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent_dir_mt/loss.svg"));
  }
  PlotOptions tiny;
  tiny.width = 10;
  EXPECT_THROW(render_svg_line_chart({}, tiny), Error);
  // No data at all still gives a valid (empty) chart.
  const std::string svg = render_svg_line_chart({});
  EXPECT_EQ(count(svg, "<polyline"), 0u);
  EXPECT_THAT(svg, HasSubstr("</svg>"));
}

}  // namespace
}  // namespace mt::train
