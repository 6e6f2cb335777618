#include "apps/bench/bench_plot.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace k3::cli {
namespace {

// Figure geometry, in SVG user units (pixels at 100 %).
constexpr double kMargin = 16;
constexpr double kTitleHeight = 52;
constexpr double kLegendHeight = 28;
constexpr double kPanelWidth = 400;
constexpr double kPanelHeight = 290;
// Inside a panel: room for the title above and the tick labels and axis labels around.
constexpr double kPadLeft = 70, kPadRight = 18, kPadTop = 30, kPadBottom = 50;

// Distinguishable on white and for the common colour-vision deficiencies (Tableau 10 order).
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                   "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

std::string Escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
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
        out += ch;
    }
  }
  return out;
}

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

// 1, 2 or 5 times a power of ten, at least `x`: tick steps people can read.
double NiceStep(double x) {
  const double p = std::pow(10.0, std::floor(std::log10(x)));
  const double f = x / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

std::string TickLabel(double v, double step) {
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return absl::StrFormat("%.*f", decimals, v);
}

std::string ColorOf(int index) { return kColors[index % std::size(kColors)]; }

// Maps data to the plot area of one panel.
struct Frame {
  double left, right, top, bottom;  // plot area
  double log_min, log_max;          // x range in log2(queue depth)
  double y_max;                     // y range is [0, y_max]
  double y_step;

  double X(int depth) const {
    return left + (std::log2(depth) - log_min) / (log_max - log_min) * (right - left);
  }
  double Y(double v) const { return bottom - v / y_max * (bottom - top); }
};

Frame MakeFrame(const PlotPanel& panel, double px, double py) {
  Frame f{px + kPadLeft,
          px + kPanelWidth - kPadRight,
          py + kPadTop,
          py + kPanelHeight - kPadBottom,
          0,
          0,
          0,
          0};
  double lo = INFINITY, hi = -INFINITY, top = 0;
  for (const PlotSeries& s : panel.series) {
    for (const PlotPoint& p : s.points) {
      lo = std::min(lo, std::log2(p.queue_depth));
      hi = std::max(hi, std::log2(p.queue_depth));
      if (std::isfinite(p.seconds_per_token)) top = std::max(top, p.seconds_per_token);
    }
  }
  if (!(lo <= hi)) lo = hi = 0;
  // A little room beyond the outermost depths so that their markers stay inside the axes.
  const double pad = hi > lo ? (hi - lo) * 0.06 : 1;
  f.log_min = lo - pad;
  f.log_max = hi + pad;
  if (top <= 0) top = 1;
  f.y_step = NiceStep(top / 4);
  f.y_max = std::ceil(top * 1.05 / f.y_step) * f.y_step;
  return f;
}

std::set<int> DepthsOf(const PlotPanel& panel) {
  std::set<int> depths;
  for (const PlotSeries& s : panel.series) {
    for (const PlotPoint& p : s.points) depths.insert(p.queue_depth);
  }
  return depths;
}

void DrawAxes(const PlotPanel& panel, const Frame& f, std::string* svg) {
  for (double v = 0; v <= f.y_max + f.y_step / 2; v += f.y_step) {
    const std::string y = Num(f.Y(v));
    absl::StrAppend(svg, "<line x1=\"", Num(f.left), "\" y1=\"", y, "\" x2=\"", Num(f.right),
                    "\" y2=\"", y, "\" stroke=\"#e0e0e0\"/>\n", "<text x=\"", Num(f.left - 6),
                    "\" y=\"", Num(f.Y(v) + 4), "\" text-anchor=\"end\">", TickLabel(v, f.y_step),
                    "</text>\n");
  }
  for (int depth : DepthsOf(panel)) {
    const std::string x = Num(f.X(depth));
    absl::StrAppend(svg, "<line x1=\"", x, "\" y1=\"", Num(f.bottom), "\" x2=\"", x, "\" y2=\"",
                    Num(f.bottom + 5), "\" stroke=\"#333\"/>\n", "<text x=\"", x, "\" y=\"",
                    Num(f.bottom + 18), "\" text-anchor=\"middle\">", depth, "</text>\n");
  }
  // A path, not a polyline: polylines are the data series only.
  absl::StrAppend(svg, "<path fill=\"none\" stroke=\"#333\" d=\"M", Num(f.left), ",", Num(f.top),
                  " V", Num(f.bottom), " H", Num(f.right), "\"/>\n");
  const double mid_x = (f.left + f.right) / 2, mid_y = (f.top + f.bottom) / 2;
  absl::StrAppend(svg, "<text x=\"", Num(mid_x), "\" y=\"", Num(f.bottom + 38),
                  "\" text-anchor=\"middle\">queue depth (reads in flight, log2 scale)</text>\n",
                  "<text x=\"", Num(f.left - 52), "\" y=\"", Num(mid_y),
                  "\" text-anchor=\"middle\" transform=\"rotate(-90 ", Num(f.left - 52), " ",
                  Num(mid_y), ")\">s/token (median)</text>\n");
}

void DrawSeries(const PlotSeries& s, int color, const Frame& f, std::string* svg) {
  std::vector<PlotPoint> points;
  for (const PlotPoint& p : s.points) {
    if (p.queue_depth > 0 && std::isfinite(p.seconds_per_token)) points.push_back(p);
  }
  std::sort(points.begin(), points.end(),
            [](const PlotPoint& a, const PlotPoint& b) { return a.queue_depth < b.queue_depth; });
  absl::StrAppend(svg, "<g class=\"series\" data-prefetch-distance=\"", s.prefetch_distance,
                  "\">\n<polyline fill=\"none\" stroke=\"", ColorOf(color),
                  "\" stroke-width=\"2\" points=\"");
  for (size_t i = 0; i < points.size(); ++i) {
    absl::StrAppend(svg, i > 0 ? " " : "", Num(f.X(points[i].queue_depth)), ",",
                    Num(f.Y(points[i].seconds_per_token)));
  }
  absl::StrAppend(svg, "\"/>\n");
  for (const PlotPoint& p : points) {
    absl::StrAppend(svg, "<circle cx=\"", Num(f.X(p.queue_depth)), "\" cy=\"",
                    Num(f.Y(p.seconds_per_token)), "\" r=\"3\" fill=\"", ColorOf(color), "\"/>\n");
  }
  absl::StrAppend(svg, "</g>\n");
}

// Colours follow the prefetch distance, so that a distance has the same colour in every panel.
std::vector<int> AllDistances(const std::vector<PlotPanel>& panels) {
  std::set<int> distances;
  for (const PlotPanel& p : panels) {
    for (const PlotSeries& s : p.series) distances.insert(s.prefetch_distance);
  }
  return {distances.begin(), distances.end()};
}

int ColorIndex(const std::vector<int>& distances, int distance) {
  return static_cast<int>(std::lower_bound(distances.begin(), distances.end(), distance) -
                          distances.begin());
}

void DrawLegend(const std::vector<int>& distances, double y, std::string* svg) {
  double x = kMargin;
  absl::StrAppend(svg, "<g class=\"legend\">\n<text x=\"", Num(x), "\" y=\"", Num(y + 4),
                  "\">prefetch distance:</text>\n");
  x += 122;
  for (size_t i = 0; i < distances.size(); ++i) {
    const std::string label =
        distances[i] == 0 ? "0 (off)"
                          : absl::StrCat(distances[i], distances[i] == 1 ? " layer" : " layers");
    absl::StrAppend(svg, "<line x1=\"", Num(x), "\" y1=\"", Num(y), "\" x2=\"", Num(x + 24),
                    "\" y2=\"", Num(y), "\" stroke=\"", ColorOf(static_cast<int>(i)),
                    "\" stroke-width=\"2\"/>\n", "<text x=\"", Num(x + 30), "\" y=\"", Num(y + 4),
                    "\">", Escape(label), "</text>\n");
    x += 40 + 7.5 * static_cast<double>(label.size()) + 16;
  }
  absl::StrAppend(svg, "</g>\n");
}

}  // namespace

std::string RenderBenchPlot(const std::vector<PlotPanel>& panels, const std::string& caption) {
  const int n = std::max<int>(1, static_cast<int>(panels.size()));
  const int columns = std::min(n, 2);
  const int rows = (n + columns - 1) / columns;
  const double width = 2 * kMargin + columns * kPanelWidth;
  const double panels_top = kTitleHeight + kLegendHeight;
  const double height = panels_top + rows * kPanelHeight + kMargin;
  std::string svg = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", Num(width), "\" height=\"", Num(height),
      "\" viewBox=\"0 0 ", Num(width), " ", Num(height),
      "\" font-family=\"sans-serif\" font-size=\"12\">\n",
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", "<text x=\"", Num(kMargin),
      "\" y=\"22\" font-size=\"15\" font-weight=\"bold\">k3 bench: s/token against queue "
      "depth</text>\n",
      "<text x=\"", Num(kMargin), "\" y=\"40\" fill=\"#555\">", Escape(caption), "</text>\n");
  const std::vector<int> distances = AllDistances(panels);
  DrawLegend(distances, kTitleHeight + kLegendHeight / 2, &svg);
  for (size_t i = 0; i < panels.size(); ++i) {
    const double px = kMargin + static_cast<double>(i % columns) * kPanelWidth;
    const double py = panels_top + static_cast<double>(i / columns) * kPanelHeight;
    const Frame f = MakeFrame(panels[i], px, py);
    absl::StrAppend(&svg, "<g class=\"panel\">\n<text x=\"", Num((f.left + f.right) / 2), "\" y=\"",
                    Num(py + 18), "\" text-anchor=\"middle\" font-weight=\"bold\">",
                    Escape(panels[i].title), "</text>\n");
    DrawAxes(panels[i], f, &svg);
    for (const PlotSeries& s : panels[i].series) {
      DrawSeries(s, ColorIndex(distances, s.prefetch_distance), f, &svg);
    }
    absl::StrAppend(&svg, "</g>\n");
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace k3::cli
