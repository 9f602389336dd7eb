// Joining and splitting along a dim: cat, stack, split, chunk (torch semantics).
// cat and stack copy (differentiable: the gradient of each input is a narrow view of the output's
// gradient); split and chunk return narrow views of x, differentiable together: one backward
// writes their gradients into one tensor shaped as x (zeros for views no gradient reached).
#pragma once

#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime {

// Concatenation along `dim`: tensors of one dtype and device and equal shapes except at `dim`
// (at least one tensor, none 0-D). Errors name the offending tensor's position and shapes.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Tensors of equal shape joined along a new dim `dim` (in [-(ndim + 1), ndim]).
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// Views of x of `split_size` along `dim` (the last one smaller when it does not divide).
// A dim of size 0 gives one empty view.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// Views of x of the given sizes along `dim` (they must add up to x.size(dim)). Note that
// split(x, {n}, d) picks the overload above; a single size equal to x.size(d) is the same anyway.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// split(x, ceil(x.size(dim) / chunks), dim): at most `chunks` views (fewer when the size does not
// allow that many non-empty ones, as in torch; `chunks` empty views for a dim of size 0).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace mt::runtime
