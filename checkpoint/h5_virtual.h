// HDF5 virtual datasets: one whole-tensor view over the chunks the ranks wrote, kept in the
// checkpoint's index file so that h5py or h5dump read every tensor whole without minititan.
//
// create_virtual_dataset maps each source chunk (a dataset in a rank file) to its region of the
// whole tensor. The sources must tile the tensor exactly: inside it, not overlapping, covering
// every element (a gap would read as the fill value below, without any error). The virtual
// dataset gets the `dtype` and `global_shape` attributes of h5_tensor.h, so read_hyperslab()
// reads it too.
//
// Source file names: a relative name is resolved by HDF5 next to the index file (HDF5 1.10 tries,
// in order, $HDF5_VDS_PREFIX, the dataset access prefix, the index file's own folder, then the
// working directory), so give the rank files' names relative to the index file's folder (e.g.
// "rank-0.h5" beside "index.h5") and the checkpoint folder can be moved or renamed as a whole.
// "." names the index file itself.
//
// Missing data: a source file that cannot be found (or opened) reads, without an error, as the
// virtual dataset's fill value: NaN for float tensors (f32, f64, bf16 0x7FC0, f16 0x7E00), the
// type's minimum for integers (INT32_MIN, INT64_MIN), FALSE for bool; so a missing rank file shows
// in h5py as NaN instead of plausible zeros. Checkpoint readers should still check that the rank
// files exist (and verify checksums, which a virtual dataset read does not).
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"

namespace mt::checkpoint {

struct VirtualSource {
  std::string file;             // relative to the index file's folder, absolute, or "."
  std::string dataset;          // the chunk's dataset path in that file
  runtime::Shape global_offset;  // where the chunk starts in the whole tensor
  runtime::Shape sizes;          // the chunk's shape
};

// Creates the virtual dataset `path` (intermediate groups included) in `index_file`. A 0-d
// tensor needs exactly one source. Throws naming the index file, the path and the bad source.
void create_virtual_dataset(hid_t index_file, const std::string& path, runtime::DType dtype,
                            const runtime::Shape& global_shape,
                            const std::vector<VirtualSource>& sources);

}  // namespace mt::checkpoint
