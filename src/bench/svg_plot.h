#pragma once
// A small, dependency-free SVG line chart for the benchmark reports: one or more series of (x, y)
// points joined by lines, each point optionally labelled (batch sizes on the cost curves), linear
// or logarithmic axes with 1-2-5 ticks, a legend, a title and axis titles. The output is
// standalone SVG 1.1 (no scripts, no external fonts or references), so browsers, rsvg-convert and
// GitHub render it the same.
#include <string>
#include <vector>

namespace ossrt::bench {

struct PlotSeries {
  std::string name;                 // legend entry
  std::vector<double> x, y;         // same length; points with a non-finite or (log axis) <= 0 value are left out
  std::vector<std::string> labels;  // empty, or one per point (drawn beside it)
};

struct PlotAxis {
  std::string title;
  bool log = false;
};

struct PlotSpec {
  std::string title;
  std::string subtitle;  // second line under the title (model, device, commit)
  PlotAxis x, y;
  std::vector<PlotSeries> series;
  int width = 880, height = 560;
};

std::string render_svg(const PlotSpec& spec);

// Escapes &, <, >, " and ' for XML text and attributes (and drops control characters XML 1.0
// does not allow).
std::string xml_escape(const std::string& text);

// Tick positions for [lo, hi]: 1-2-5 steps on a linear axis, powers of ten (with 2 and 5 between
// when the range spans under three decades) on a log axis. Exposed for tests.
std::vector<double> axis_ticks(double lo, double hi, bool log);

}  // namespace ossrt::bench
