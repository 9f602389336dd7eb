// The end-of-run outputs of a TrainResult (see train_result.h).
#include "train/train_result.h"

#include <iomanip>

#include "train/metrics/step_metrics.h"
#include "train/metrics/svg_plot.h"

namespace mt::train {

void plot_losses(const TrainResult& result, const std::filesystem::path& svg,
                 const std::string& title) {
  if (result.losses.empty()) return;
  std::vector<PlotSeries> series(1);
  series[0].name = "loss";
  for (size_t i = 0; i < result.losses.size(); ++i)
    series[0].points.emplace_back(double(result.first_step + int64_t(i)), result.losses[i]);
  if (!result.val_losses.empty()) {
    PlotSeries val{"val_loss", {}};
    for (const auto& [s, v] : result.val_losses) val.points.emplace_back(double(s), v);
    series.push_back(std::move(val));
  }
  PlotOptions po;
  po.title = title;
  write_svg_line_chart(svg.string(), series, po);
}

void log_summary(const TrainResult& result, const std::filesystem::path& files_in,
                 std::ostream& out) {
  out << "trained " << result.losses.size() << " steps";
  if (result.first_step > 1 && !result.losses.empty())
    out << " (" << result.first_step << " to " << result.steps_done << ")";
  out << " in " << format_duration(result.seconds);
  if (!result.losses.empty())
    out << ": loss " << std::fixed << std::setprecision(4) << result.losses.front() << " -> "
        << result.losses.back() << std::defaultfloat;
  if (!files_in.empty()) out << "; metrics and loss.svg in " << files_in.string();
}

}  // namespace mt::train
