// What a checkpoint holds, as one rank sees it: named tensors (each rank's piece of each, placed
// in the whole tensor by its global shape and offset) and named non-tensor values. checkpoint/
// never knows which model, optimizer or loader produced them (train/ assembles them).
//
// Tensors. A piece held by several ranks (a replicated tensor, an HSDP shard) is recognised by
// its (fqn, offset, shape) and written once. For loading, `local` is the destination: its shape
// and offset say which region this rank wants, from any saved layout.
// Values. Keys are paths ("step", "dataloader/rank_0/position"); each is a scalar int64, float64
// or string dataset under /state in the index file, readable with any HDF5 tool.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::checkpoint {

// Streamed pieces (kv-backed tables, whose rows are never whole in memory): `local` is then only
// a shape and dtype (lazy_placeholder), and the data is made when the piece is written
// (`produce`, called on the writer's thread, possibly after the save call returned: read from a
// consistent view) or handed over as soon as it is read (`consume`), one piece at a time.
struct TensorPiece {
  std::string fqn;
  runtime::Tensor local;        // this rank's piece (saving) or where to read into (loading)
  runtime::Shape global_shape;  // the whole tensor's shape
  runtime::Shape global_offset;  // where `local` starts in it (size = rank of the tensor)
  std::function<runtime::Tensor()> produce = nullptr;             // saving a streamed piece
  std::function<void(const runtime::Tensor&)> consume = nullptr;  // loading a streamed piece
  bool streamed() const { return produce != nullptr || consume != nullptr; }
};

// A tensor of `shape` and `dtype` that holds no memory (one element, expanded): the `local` of a
// streamed piece.
runtime::Tensor lazy_placeholder(const runtime::Shape& shape, runtime::DType dtype);

using Value = std::variant<int64_t, double, std::string>;
using Values = std::map<std::string, Value>;

struct CheckpointState {
  std::vector<TensorPiece> tensors;
  // Values saved once for the job (rank 0's are written; every rank's are the same).
  Values values;
  // Values that differ per rank, saved as rank_<r>/<key> under `per_rank_group` (e.g. the data
  // loader state of every data-parallel rank): on load, every saved rank's come back.
  std::string per_rank_group;
  Values per_rank_values;
};

// A whole tensor on one rank: offset 0, global shape = its shape.
TensorPiece whole(std::string fqn, const runtime::Tensor& tensor);

}  // namespace mt::checkpoint
