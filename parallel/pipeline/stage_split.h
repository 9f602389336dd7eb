// How a model is cut into pipeline stages, and the view of one rank's stages as one module.
//
// - stage_layer_ranges: the blocks [begin, end) of each stage, from torchtitan's settings
//   (layers per stage, explicit split points "layers.N", or an even split). The first stage also
//   holds the embeddings and the last the final norm and output (the model's build_stage does
//   that); stages that do not divide the layers are errors naming the numbers.
// - merge_stage_modules: the stages one rank holds (several with virtual stages) as one module
//   whose parameters carry the whole model's FQNs (layers.<global index>...), so the optimizer,
//   gradient clipping and checkpoints see one model, as on a rank without pipelining. Children
//   of the same name in several stages ("layers") are merged into one container; the stages'
//   own non-persistent buffers (RoPE tables) are left out. The view shares the stages' modules:
//   forwards still run on the stages.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/nn/module.h"

namespace mt::parallel::pipeline {

struct LayerSplit {
  int64_t begin = 0;
  int64_t end = 0;
};

// num_stages stages over n_layers blocks. layers_per_stage > 0: that many per stage (must give
// num_stages stages); split_points (e.g. {"layers.4"}): the first block of each stage after the
// first, num_stages - 1 of them, increasing; neither: an even split (n_layers % num_stages == 0).
std::vector<LayerSplit> stage_layer_ranges(int64_t n_layers, int64_t num_stages,
                                           int64_t layers_per_stage,
                                           const std::vector<std::string>& split_points);

// One module over `stages` (see above); `stages` in global stage order.
std::shared_ptr<runtime::nn::Module> merge_stage_modules(
    const std::vector<std::shared_ptr<runtime::nn::Module>>& stages);

}  // namespace mt::parallel::pipeline
