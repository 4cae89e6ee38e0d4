#include "bench/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace ossrt::bench {

namespace {

// Colour-blind-safe palette (Okabe & Ito), in the order curves are added.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};
constexpr int kMarginLeft = 84, kMarginRight = 190, kMarginTop = 70, kMarginBottom = 64;

bool usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

double nice_step(double span, int target) {
  const double raw = span / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

std::string tick_label(double v) {
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e6 || a < 1e-3) return fmt::format("{:.0e}", v);
  if (a >= 1000) {
    // 1000 -> 1k, 32768 -> 32.8k: the axes of token counts stay short
    const double k = v / 1000;
    return std::fabs(k - std::round(k)) < 1e-9 ? fmt::format("{:.0f}k", k) : fmt::format("{:.3g}k", k);
  }
  return fmt::format("{:g}", std::round(v * 1e6) / 1e6);
}

struct Scale {
  double lo, hi;
  bool log;
  double a, b;  // pixel = a + b * t(v)
  double t(double v) const { return log ? std::log10(v) : v; }
  double px(double v) const { return a + b * (t(v) - t(lo)); }
};

Scale make_scale(double lo, double hi, bool log, double p0, double p1) {
  Scale s{lo, hi, log, p0, 0};
  const double span = s.t(hi) - s.t(lo);
  s.b = span > 0 ? (p1 - p0) / span : 0;
  return s;
}

// Data range widened to whole ticks (log: whole decades or 1-2-5 marks; linear: from 0 when all
// values are positive and 0 is near, which cost and speed axes read best from).
void padded_range(std::vector<double> values, bool log, double& lo, double& hi) {
  if (values.empty()) {
    lo = log ? 1 : 0;
    hi = log ? 10 : 1;
    return;
  }
  lo = *std::min_element(values.begin(), values.end());
  hi = *std::max_element(values.begin(), values.end());
  if (log) {
    if (hi <= lo) {
      lo /= 2;
      hi *= 2;
    }
    const double l = std::floor(std::log10(lo)), h = std::ceil(std::log10(hi));
    const bool decades = h - l >= 3;
    auto snap_down = [&](double v) {
      const double d = std::pow(10.0, std::floor(std::log10(v)));
      if (decades) return d;
      for (double m : {5.0, 2.0, 1.0})
        if (m * d <= v * (1 + 1e-12)) return m * d;
      return d;
    };
    auto snap_up = [&](double v) {
      const double d = std::pow(10.0, std::floor(std::log10(v)));
      if (decades) return v <= d * (1 + 1e-12) ? d : 10 * d;
      for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * d >= v * (1 - 1e-12)) return m * d;
      return 10 * d;
    };
    lo = snap_down(lo);
    hi = snap_up(hi);
    return;
  }
  if (lo > 0 && lo < 0.5 * hi) lo = 0;
  if (hi <= lo) hi = lo + (lo == 0 ? 1 : std::fabs(lo));
  const double step = nice_step(hi - lo, 6);
  lo = std::floor(lo / step) * step;
  hi = std::ceil(hi / step) * step;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') break;  // not allowed in XML 1.0
        out += char(c);
    }
  }
  return out;
}

std::vector<double> axis_ticks(double lo, double hi, bool log) {
  std::vector<double> ticks;
  if (!(hi > lo)) return {lo};
  if (log) {
    const int l = int(std::floor(std::log10(lo) + 1e-9)), h = int(std::ceil(std::log10(hi) - 1e-9));
    const bool fine = h - l < 3;
    for (int e = l; e <= h; ++e) {
      const double d = std::pow(10.0, e);
      for (double m : fine ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
        const double v = m * d;
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) ticks.push_back(v);
      }
    }
    return ticks;
  }
  const double step = nice_step(hi - lo, 6);
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return ticks;
}

std::string render_svg(const PlotSpec& spec) {
  const int W = spec.width, H = spec.height;
  const int x0 = kMarginLeft, x1 = W - kMarginRight, y0 = H - kMarginBottom, y1 = kMarginTop;
  std::vector<double> xs, ys;
  for (const auto& s : spec.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (usable(s.x[i], spec.x.log) && usable(s.y[i], spec.y.log)) {
        xs.push_back(s.x[i]);
        ys.push_back(s.y[i]);
      }
  double xlo, xhi, ylo, yhi;
  padded_range(xs, spec.x.log, xlo, xhi);
  padded_range(ys, spec.y.log, ylo, yhi);
  const Scale sx = make_scale(xlo, xhi, spec.x.log, x0, x1);
  const Scale sy = make_scale(ylo, yhi, spec.y.log, y0, y1);

  std::string o;
  o += fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"#ffffff\"/>\n",
      W, H);
  o += fmt::format("<text x=\"{}\" y=\"28\" font-size=\"16\" font-weight=\"bold\">{}</text>\n", x0,
                   xml_escape(spec.title));
  if (!spec.subtitle.empty())
    o += fmt::format("<text x=\"{}\" y=\"48\" font-size=\"11\" fill=\"#555555\">{}</text>\n", x0,
                     xml_escape(spec.subtitle));
  // grid and ticks
  o += "<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  const auto xt = axis_ticks(xlo, xhi, spec.x.log), yt = axis_ticks(ylo, yhi, spec.y.log);
  for (double v : xt)
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>\n", sx.px(v), y0, y1);
  for (double v : yt)
    o += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\"/>\n", x0, sy.px(v), x1);
  o += "</g>\n";
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333333\"/>\n", x0, y1,
                   x1 - x0, y0 - y1);
  o += "<g fill=\"#333333\">\n";
  for (double v : xt)
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", sx.px(v), y0 + 18,
                     xml_escape(tick_label(v)));
  for (double v : yt)
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", x0 - 8, sy.px(v) + 4,
                     xml_escape(tick_label(v)));
  o += "</g>\n";
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\">{}</text>\n", (x0 + x1) / 2, H - 18,
                   xml_escape(spec.x.title + (spec.x.log ? " (log scale)" : "")));
  o += fmt::format(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 18 {0})\">{1}</text>\n",
      (y0 + y1) / 2, xml_escape(spec.y.title + (spec.y.log ? " (log scale)" : "")));
  // series
  for (size_t k = 0; k < spec.series.size(); ++k) {
    const PlotSeries& s = spec.series[k];
    const char* colour = kPalette[k % std::size(kPalette)];
    std::string points;
    std::vector<size_t> kept;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!usable(s.x[i], spec.x.log) || !usable(s.y[i], spec.y.log)) continue;
      points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", sx.px(s.x[i]), sy.px(s.y[i]));
      kept.push_back(i);
    }
    o += fmt::format("<g>\n<title>{}</title>\n", xml_escape(s.name));
    if (kept.size() > 1)
      o += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", points, colour);
    for (size_t i : kept) {
      const double px = sx.px(s.x[i]), py = sy.px(s.y[i]);
      o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n", px, py, colour);
      if (i < s.labels.size() && !s.labels[i].empty())
        o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"{}\">{}</text>\n", px + 5, py - 6,
                         colour, xml_escape(s.labels[i]));
    }
    o += "</g>\n";
    // legend
    const int ly = y1 + 8 + int(k) * 20;
    o += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>\n", x1 + 14,
                     ly, x1 + 38, colour);
    o += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"{}\"/>\n", x1 + 26, ly, colour);
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", x1 + 44, ly + 4, xml_escape(s.name));
  }
  if (xs.empty())
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#999999\">no data</text>\n", (x0 + x1) / 2,
                     (y0 + y1) / 2);
  o += "</svg>\n";
  return o;
}

}  // namespace ossrt::bench
