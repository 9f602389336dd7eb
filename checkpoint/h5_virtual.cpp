// Whole-tensor virtual datasets over rank files (see h5_virtual.h).
#include "checkpoint/h5_virtual.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "checkpoint/h5_attributes.h"
#include "checkpoint/h5_dtype.h"
#include "checkpoint/h5_file.h"
#include "runtime/core/error.h"
#include "runtime/io/hdf5.h"

namespace mt::checkpoint {
namespace {

using runtime::Shape;

std::string describe(const VirtualSource& s) {
  return detail::concat("source ", s.file, ":", s.dataset, " (offset ", s.global_offset, ", sizes ",
                        s.sizes, ")");
}

bool overlap(const VirtualSource& a, const VirtualSource& b) {
  for (size_t d = 0; d < a.sizes.size(); ++d) {
    const int64_t lo = std::max(a.global_offset[d], b.global_offset[d]);
    const int64_t hi =
        std::min(a.global_offset[d] + a.sizes[d], b.global_offset[d] + b.sizes[d]);
    if (lo >= hi) return false;
  }
  return true;
}

// Sources inside the tensor, pairwise disjoint and as many elements as it: an exact tiling.
void check_tiling(const Shape& global_shape, const std::vector<VirtualSource>& sources,
                  const std::string& where) {
  int64_t covered = 0;
  for (const VirtualSource& s : sources) {
    MT_CHECK(!s.file.empty() && !s.dataset.empty(), where, ": ", describe(s),
             " needs a file and a dataset name");
    MT_CHECK(s.global_offset.size() == global_shape.size() && s.sizes.size() == global_shape.size(),
             where, ": ", describe(s), " does not have the tensor's rank ", global_shape.size(),
             " (global shape ", global_shape, ")");
    for (size_t d = 0; d < global_shape.size(); ++d) {
      MT_CHECK(s.global_offset[d] >= 0 && s.sizes[d] >= 0 &&
                   s.global_offset[d] + s.sizes[d] <= global_shape[d],
               where, ": ", describe(s), " is outside the global shape ", global_shape,
               " (dimension ", d, ")");
    }
    covered += runtime::numel_of(s.sizes);
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (runtime::numel_of(sources[i].sizes) == 0) continue;
    for (size_t j = i + 1; j < sources.size(); ++j) {
      MT_CHECK(runtime::numel_of(sources[j].sizes) == 0 || !overlap(sources[i], sources[j]), where,
               ": ", describe(sources[i]), " overlaps ", describe(sources[j]));
    }
  }
  MT_CHECK(covered == runtime::numel_of(global_shape), where, ": the sources cover ", covered,
           " elements of the global shape ", global_shape, "'s ", runtime::numel_of(global_shape),
           " (a gap would read as the fill value, without any error)");
}

// The value a region without data reads as (a source file that is missing, or cannot be read):
// NaN for floats (quiet NaN; bf16 0x7FC0, f16 0x7E00) and the minimum for integers, so that a
// missing rank file shows in h5py instead of reading as zeros. Bool keeps FALSE (0): a bool has
// no value to spare for "missing". The bytes are in `dtype`'s stored type (h5_dtype.h).
std::vector<unsigned char> missing_data_fill(runtime::DType dtype) {
  using runtime::DType;
  auto bytes = [](auto value) {
    std::vector<unsigned char> out(sizeof(value));
    std::memcpy(out.data(), &value, sizeof(value));
    return out;
  };
  switch (dtype) {
    case DType::F32: return bytes(std::numeric_limits<float>::quiet_NaN());
    case DType::F64: return bytes(std::numeric_limits<double>::quiet_NaN());
    case DType::BF16: return bytes(uint16_t{0x7FC0});
    case DType::F16: return bytes(uint16_t{0x7E00});
    case DType::I32: return bytes(std::numeric_limits<int32_t>::min());
    case DType::I64: return bytes(std::numeric_limits<int64_t>::min());
    case DType::Bool: return bytes(int8_t{0});
  }
  MT_FAIL("checkpoint: unknown dtype ", static_cast<int>(dtype));
}

}  // namespace

void create_virtual_dataset(hid_t index_file, const std::string& path, runtime::DType dtype,
                            const Shape& global_shape, const std::vector<VirtualSource>& sources) {
  const std::string where = "checkpoint index " + file_name(index_file) + ", virtual dataset " + path;
  MT_CHECK(!global_shape.empty() || sources.size() == 1, where,
           ": a 0-d tensor needs exactly one source, got ", sources.size());
  check_tiling(global_shape, sources, where);

  h5::Lock lock;
  MT_CHECK(!path_exists(index_file, path), where, ": already exists");
  h5::Datatype type = hdf5_type(dtype);
  h5::Dataspace vspace = dataspace_of(global_shape, where);
  h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", where);
  h5::check(H5Pset_layout(dcpl.get(), H5D_VIRTUAL), "H5Pset_layout", where);
  const std::vector<unsigned char> fill = missing_data_fill(dtype);
  h5::check(H5Pset_fill_value(dcpl.get(), type.get(), fill.data()), "H5Pset_fill_value", where);
  for (const VirtualSource& s : sources) {
    if (runtime::numel_of(s.sizes) == 0) continue;  // nothing to map (and HDF5 rejects it)
    h5::Dataspace sspace = dataspace_of(s.sizes, where);
    if (global_shape.empty()) {
      h5::check(H5Sselect_all(vspace.get()), "H5Sselect_all", where);
    } else {
      std::vector<hsize_t> start(s.global_offset.begin(), s.global_offset.end());
      std::vector<hsize_t> count(s.sizes.begin(), s.sizes.end());
      h5::check(H5Sselect_hyperslab(vspace.get(), H5S_SELECT_SET, start.data(), nullptr,
                                    count.data(), nullptr),
                "H5Sselect_hyperslab", where, describe(s));
    }
    h5::check(H5Pset_virtual(dcpl.get(), vspace.get(), s.file.c_str(), s.dataset.c_str(),
                             sspace.get()),
              "H5Pset_virtual", where, describe(s));
  }
  h5::check(H5Sselect_all(vspace.get()), "H5Sselect_all", where);
  h5::PropList lcpl = intermediate_groups_lcpl(where);
  h5::Dataset dataset(H5Dcreate2(index_file, path.c_str(), type.get(), vspace.get(), lcpl.get(),
                                 dcpl.get(), H5P_DEFAULT),
                      "H5Dcreate2", where);
  write_string_attr(dataset.get(), "dtype", std::string(storage_dtype_name(dtype)), where);
  write_i64s_attr(dataset.get(), "global_shape", global_shape, where);
}

}  // namespace mt::checkpoint
