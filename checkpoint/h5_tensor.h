// One tensor chunk per HDF5 dataset: the storage layer of distributed checkpoints.
//
// A rank's checkpoint file holds one dataset per chunk it saves (a whole tensor, or its shard of
// one). Each dataset is contiguous and uncompressed (so a hyperslab read touches only its own
// bytes and a write streams at disk speed) and carries these attributes:
//   fqn                 string  the tensor's fully qualified name, e.g. "layers.0.attention.wq.weight"
//   global_shape        int64[] the whole tensor's shape (empty for a 0-d tensor)
//   global_offset       int64[] where this chunk starts in the whole tensor (same length)
//   dtype               string  storage_dtype_name() ("float32", "bfloat16", ...; see h5_dtype.h)
//   checksum            uint64  XXH64 of the dataset's bytes (see checksum.h)
//   checksum_algorithm  string  "xxh64"
// 0-d tensors are scalar datasets; empty tensors (a zero-sized dimension) are datasets with that
// extent and no data.
//
// Threads: every function here holds h5::Lock (runtime/io/hdf5.h) around its HDF5 calls.
// write_tensor, read_tensor and verify_checksum move data in slices of at most `slice_bytes`
// (whole rows of the first dimension) and release the lock between slices, so a save on a
// background thread never blocks the data loader's token-file reads for longer than one slice;
// checksums are computed outside the lock. read_hyperslab reads its region in one call (loads
// run before training, when nothing waits on the lock).
//
// Errors name the file, the dataset and (once known) the tensor: "checkpoint file
// /ckpt/step-10/rank-1.h5, dataset /model/w (tensor w): checksum mismatch ...".
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/h5_file.h"
#include "checkpoint/rank_file_seal.h"
#include "runtime/core/tensor.h"

namespace mt::checkpoint {

using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

// Reads and writes move at most this many bytes per HDF5 call (whole rows; one row if larger).
inline constexpr size_t kIoSliceBytes = size_t{64} << 20;

// Where a chunk sits in its tensor.
struct ChunkInfo {
  std::string fqn;
  Shape global_shape;
  Shape global_offset;
};

// The attributes of a stored chunk, plus its own shape.
struct StoredChunk {
  ChunkInfo info;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t checksum = 0;
};

// Writes `tensor` (any device, any layout; copied to a contiguous host tensor when needed) as a
// new dataset at `path` (e.g. "/model/layers.0.w"), creating intermediate groups. `info` must
// have the tensor's rank and place the tensor inside global_shape. Throws if `path` exists.
// Returns where its raw data lies in the file (for the file's seal, rank_file_seal.h).
FileExtent write_tensor(hid_t file, const std::string& path, const Tensor& tensor, const ChunkInfo& info,
                  size_t slice_bytes = kIoSliceBytes);

// The chunk's attributes, checked for consistency (ranks agree, the chunk fits in the tensor).
StoredChunk read_chunk_info(hid_t file, const std::string& path);

// The whole chunk as a contiguous CPU tensor of its dtype, its checksum verified (a mismatch
// throws naming the file, the dataset and the tensor).
Tensor read_tensor(hid_t file, const std::string& path, size_t slice_bytes = kIoSliceBytes);

// Reads the dataset's bytes and compares their checksum with the stored one; throws on a
// mismatch. Memory use is bounded by slice_bytes, whatever the dataset's size.
void verify_checksum(hid_t file, const std::string& path, size_t slice_bytes = kIoSliceBytes);

// The region [offset, offset + counts) of the dataset (for resharded loads) as a contiguous CPU
// tensor of the stored dtype. Needs only the `dtype` attribute, so it also reads the virtual
// datasets of h5_virtual.h. No checksum check: a partial read cannot verify one (use
// verify_checksum). `offset` and `counts` have the dataset's rank (empty for a scalar).
Tensor read_hyperslab(hid_t file, const std::string& path, const Shape& offset,
                      const Shape& counts);
// As read_hyperslab, into `dest` (counts = dest's shape; its dtype must be the stored one). A
// contiguous CPU `dest` is read into directly; any other goes through a temporary.
void read_hyperslab_into(hid_t file, const std::string& path, const Shape& offset,
                         const Tensor& dest);

}  // namespace mt::checkpoint
