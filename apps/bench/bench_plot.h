// The `k3 bench --plot` figure: s/token against queue depth, one panel per volume (model
// directory x storage profile), one line per prefetch distance. Plain SVG text, so that the
// figure can be committed next to the table it comes from and diffed, with no plotting library.
#pragma once

#include <string>
#include <vector>

namespace k3::cli {

struct PlotPoint {
  int queue_depth = 0;
  double seconds_per_token = 0;
};

struct PlotSeries {
  int prefetch_distance = 0;
  std::vector<PlotPoint> points;  // in any order; drawn by increasing depth
};

struct PlotPanel {
  std::string title;  // "model dir · profile"
  std::vector<PlotSeries> series;
};

// A standalone SVG document (valid XML): the panels in a grid of up to two columns, each with
// its own y scale (volumes differ by orders of magnitude), a log-2 x axis, axis labels, and one
// legend for all panels. `caption` goes under the title.
std::string RenderBenchPlot(const std::vector<PlotPanel>& panels, const std::string& caption);

}  // namespace k3::cli
