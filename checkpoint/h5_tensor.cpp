// Tensor chunks as HDF5 datasets (see h5_tensor.h).
#include "checkpoint/h5_tensor.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "checkpoint/checksum.h"
#include "checkpoint/h5_attributes.h"
#include "checkpoint/h5_dtype.h"
#include "runtime/core/error.h"

namespace mt::checkpoint {
namespace {

std::string hex(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Rows are slices of the first dimension; a 0-d tensor is one row.
int64_t row_count(const Shape& shape) { return shape.empty() ? 1 : shape[0]; }

// Calls fn(begin, end, byte_offset, byte_count) over the rows [0, rows) in pieces of at most
// slice_bytes (one row at least); nothing for an empty shape.
using SliceFn = std::function<void(int64_t, int64_t, size_t, size_t)>;
void for_each_slice(const Shape& shape, size_t element_size, size_t slice_bytes,
                    const SliceFn& fn) {
  const int64_t rows = row_count(shape);
  if (runtime::numel_of(shape) == 0) return;
  const size_t row_bytes = size_t(runtime::numel_of(shape) / rows) * element_size;
  const int64_t per_slice = std::max<int64_t>(1, int64_t(slice_bytes / row_bytes));
  for (int64_t begin = 0; begin < rows; begin += per_slice) {
    const int64_t end = std::min(rows, begin + per_slice);
    fn(begin, end, size_t(begin) * row_bytes, size_t(end - begin) * row_bytes);
  }
}

// Reads (write = false) or writes rows [begin, end) of `dataset` from/to `buffer`, holding the
// lock for this one transfer.
void transfer_rows(hid_t dataset, hid_t type, const Shape& shape, int64_t begin, int64_t end,
                   void* buffer, bool write, const std::string& where) {
  h5::Lock lock;
  const char* op = write ? "H5Dwrite" : "H5Dread";
  if (shape.empty()) {
    herr_t rc = write ? H5Dwrite(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer)
                      : H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer);
    h5::check(rc, op, where);
    return;
  }
  std::vector<hsize_t> offset(shape.size(), 0), count(shape.begin(), shape.end());
  offset[0] = hsize_t(begin);
  count[0] = hsize_t(end - begin);
  h5::Dataspace fspace(H5Dget_space(dataset), "H5Dget_space", where);
  h5::check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, offset.data(), nullptr, count.data(),
                                nullptr),
            "H5Sselect_hyperslab", where);
  h5::Dataspace mspace(H5Screate_simple(int(count.size()), count.data(), nullptr),
                       "H5Screate_simple", where);
  const std::string rows = "rows [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  herr_t rc = write ? H5Dwrite(dataset, type, mspace.get(), fspace.get(), H5P_DEFAULT, buffer)
                    : H5Dread(dataset, type, mspace.get(), fspace.get(), H5P_DEFAULT, buffer);
  h5::check(rc, op, where, rows);
}

void check_chunk_info(const ChunkInfo& info, const Shape& shape, const std::string& where) {
  MT_CHECK(!info.fqn.empty(), where, ": the tensor's fully qualified name (fqn) is empty");
  MT_CHECK(info.global_shape.size() == shape.size() && info.global_offset.size() == shape.size(),
           where, " (tensor ", info.fqn, "): global_shape ", info.global_shape,
           " and global_offset ", info.global_offset, " should have the chunk's rank ",
           shape.size(), " (chunk shape ", shape, ")");
  for (size_t d = 0; d < shape.size(); ++d) {
    MT_CHECK(info.global_offset[d] >= 0 && shape[d] >= 0 &&
                 info.global_offset[d] + shape[d] <= info.global_shape[d],
             where, " (tensor ", info.fqn, "): a chunk of shape ", shape, " at global_offset ",
             info.global_offset, " does not fit in global_shape ", info.global_shape,
             " (dimension ", d, ")");
  }
}

// An open tensor dataset with its dtype (from the `dtype` attribute, checked against the stored
// type) and shape. Opened under the caller's lock.
struct OpenDataset {
  h5::Dataset dataset;
  std::string where;
  DType dtype = DType::F32;
  Shape shape;
};

OpenDataset open_dataset(hid_t file, const std::string& path) {
  OpenDataset out;
  out.where = dataset_where(file, path);
  MT_CHECK(path_exists(file, path), out.where, ": no such dataset");
  {
    const hid_t obj = H5Oopen(file, path.c_str(), H5P_DEFAULT);
    MT_CHECK(obj >= 0, out.where, ": cannot be opened (H5Oopen failed)");
    const H5I_type_t kind = H5Iget_type(obj);
    H5Oclose(obj);
    MT_CHECK(kind == H5I_DATASET, out.where, ": is a group or a named type, not a dataset");
  }
  out.dataset = h5::Dataset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "H5Dopen2", out.where);
  out.dtype = dtype_from_storage_name(read_string_attr(out.dataset.get(), "dtype", out.where),
                                      out.where);
  h5::Datatype stored(H5Dget_type(out.dataset.get()), "H5Dget_type", out.where);
  check_stored_type(stored.get(), out.dtype, out.where);
  out.shape = dataset_shape(out.dataset.get(), out.where);
  return out;
}

StoredChunk read_attributes(const OpenDataset& d) {
  const hid_t id = d.dataset.get();
  StoredChunk out;
  out.dtype = d.dtype;
  out.shape = d.shape;
  out.info.fqn = read_string_attr(id, "fqn", d.where);
  const std::string where = d.where + " (tensor " + out.info.fqn + ")";
  out.info.global_shape = read_i64s_attr(id, "global_shape", where);
  out.info.global_offset = read_i64s_attr(id, "global_offset", where);
  check_chunk_info(out.info, out.shape, d.where);
  const std::string algorithm = read_string_attr(id, "checksum_algorithm", where);
  MT_CHECK(algorithm == kChecksumAlgorithm, where, ": checksum_algorithm is '", algorithm,
           "', this build verifies '", kChecksumAlgorithm, "'");
  out.checksum = read_u64_attr(id, "checksum", where);
  return out;
}

// A chunk opened for a whole read: dataset, attributes and HDF5 type.
struct OpenChunk {
  OpenDataset d;
  StoredChunk chunk;
  h5::Datatype type;
};

OpenChunk open_chunk(hid_t file, const std::string& path) {
  h5::Lock lock;
  OpenChunk c;
  c.d = open_dataset(file, path);
  c.chunk = read_attributes(c.d);
  c.type = hdf5_type(c.d.dtype);
  return c;
}

void check_checksum(const StoredChunk& chunk, uint64_t computed, const std::string& where) {
  MT_CHECK(computed == chunk.checksum, where, " (tensor ", chunk.info.fqn,
           "): checksum mismatch: stored ", kChecksumAlgorithm, " ", hex(chunk.checksum),
           ", computed ", hex(computed),
           " from the data read; the file is damaged, refusing to load it");
}

}  // namespace

FileExtent write_tensor(hid_t file, const std::string& path, const Tensor& tensor,
                        const ChunkInfo& info, size_t slice_bytes) {
  const std::string where = dataset_where(file, path);
  MT_CHECK(tensor.defined(), where, " (tensor ", info.fqn, "): the tensor is undefined");
  check_chunk_info(info, tensor.shape(), where);
  Tensor host = tensor.detach();
  if (!host.device().is_cpu()) host = host.to(runtime::Device::cpu());
  host = host.contiguous();
  // Hashed before any HDF5 call, outside the lock.
  const uint64_t checksum = xxh64(host.data_ptr(), host.nbytes());

  h5::Dataset dataset;
  h5::Datatype type;
  {
    h5::Lock lock;
    MT_CHECK(!path_exists(file, path), where, " (tensor ", info.fqn, "): already exists");
    type = hdf5_type(host.dtype());
    h5::Dataspace space = dataspace_of(host.shape(), where);
    h5::PropList lcpl = intermediate_groups_lcpl(where);
    h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", where);
    h5::check(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout", where);
    // Every byte is written below: no fill values.
    h5::check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time", where);
    dataset = h5::Dataset(H5Dcreate2(file, path.c_str(), type.get(), space.get(), lcpl.get(),
                                     dcpl.get(), H5P_DEFAULT),
                          "H5Dcreate2", where, "tensor " + info.fqn);
    const hid_t id = dataset.get();
    write_string_attr(id, "fqn", info.fqn, where);
    write_i64s_attr(id, "global_shape", info.global_shape, where);
    write_i64s_attr(id, "global_offset", info.global_offset, where);
    write_string_attr(id, "dtype", std::string(storage_dtype_name(host.dtype())), where);
  }
  auto* bytes = static_cast<char*>(host.data_ptr());
  for_each_slice(host.shape(), host.element_size(), slice_bytes,
                 [&](int64_t begin, int64_t end, size_t at, size_t) {
                   transfer_rows(dataset.get(), type.get(), host.shape(), begin, end, bytes + at,
                                 /*write=*/true, where);
                 });
  // The checksum goes last: a dataset with one was written completely.
  h5::Lock lock;
  write_string_attr(dataset.get(), "checksum_algorithm", kChecksumAlgorithm, where);
  write_u64_attr(dataset.get(), "checksum", checksum, where);
  const haddr_t offset = H5Dget_offset(dataset.get());  // undefined for an empty dataset
  if (offset == HADDR_UNDEF) return {};
  return {int64_t(offset), int64_t(H5Dget_storage_size(dataset.get()))};
}

StoredChunk read_chunk_info(hid_t file, const std::string& path) {
  h5::Lock lock;
  return read_attributes(open_dataset(file, path));
}

Tensor read_tensor(hid_t file, const std::string& path, size_t slice_bytes) {
  OpenChunk c = open_chunk(file, path);
  Tensor out = Tensor::empty(c.d.shape, runtime::TensorOptions{}.with_dtype(c.d.dtype));
  auto* bytes = static_cast<char*>(out.data_ptr());
  Xxh64 hash;
  for_each_slice(c.d.shape, out.element_size(), slice_bytes,
                 [&](int64_t begin, int64_t end, size_t at, size_t count) {
                   transfer_rows(c.d.dataset.get(), c.type.get(), c.d.shape, begin, end,
                                 bytes + at, /*write=*/false, c.d.where);
                   hash.update(bytes + at, count);
                 });
  check_checksum(c.chunk, hash.digest(), c.d.where);
  return out;
}

void verify_checksum(hid_t file, const std::string& path, size_t slice_bytes) {
  OpenChunk c = open_chunk(file, path);
  std::vector<char> buffer;
  Xxh64 hash;
  for_each_slice(c.d.shape, runtime::dtype_size(c.d.dtype), slice_bytes,
                 [&](int64_t begin, int64_t end, size_t, size_t count) {
                   buffer.resize(count);
                   transfer_rows(c.d.dataset.get(), c.type.get(), c.d.shape, begin, end,
                                 buffer.data(), /*write=*/false, c.d.where);
                   hash.update(buffer.data(), count);
                 });
  check_checksum(c.chunk, hash.digest(), c.d.where);
}

Tensor read_hyperslab(hid_t file, const std::string& path, const Shape& offset,
                      const Shape& counts) {
  DType dtype;
  {
    h5::Lock lock;
    dtype = open_dataset(file, path).dtype;
  }
  Tensor out = Tensor::empty(counts, runtime::TensorOptions{}.with_dtype(dtype));
  read_hyperslab_into(file, path, offset, out);
  return out;
}

void read_hyperslab_into(hid_t file, const std::string& path, const Shape& offset,
                         const Tensor& dest) {
  const Shape& counts = dest.shape();
  const bool direct = dest.device().is_cpu() && dest.is_contiguous();
  Tensor target;
  {
    h5::Lock lock;
    OpenDataset d = open_dataset(file, path);
    MT_CHECK(dest.dtype() == d.dtype, d.where, ": holds ", storage_dtype_name(d.dtype),
             ", the destination is ", storage_dtype_name(dest.dtype()),
             " (read in the stored dtype, then convert)");
    MT_CHECK(offset.size() == d.shape.size() && counts.size() == d.shape.size(), d.where,
             ": a region with offset ", offset, " and counts ", counts,
             " does not have the dataset's rank ", d.shape.size(), " (shape ", d.shape, ")");
    for (size_t i = 0; i < d.shape.size(); ++i) {
      MT_CHECK(offset[i] >= 0 && counts[i] >= 0 && offset[i] + counts[i] <= d.shape[i], d.where,
               ": the region with offset ", offset, " and counts ", counts,
               " is outside the dataset's shape ", d.shape, " (dimension ", i, ")");
    }
    if (dest.numel() == 0) return;
    target = direct ? dest : Tensor::empty(counts, runtime::TensorOptions{}.with_dtype(d.dtype));
    h5::Datatype type = hdf5_type(d.dtype);
    if (d.shape.empty()) {
      h5::check(H5Dread(d.dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        target.data_ptr()),
                "H5Dread", d.where);
    } else {
      std::vector<hsize_t> start(offset.begin(), offset.end());
      std::vector<hsize_t> count(counts.begin(), counts.end());
      h5::Dataspace fspace(H5Dget_space(d.dataset.get()), "H5Dget_space", d.where);
      h5::check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr,
                                    count.data(), nullptr),
                "H5Sselect_hyperslab", d.where);
      h5::Dataspace mspace(H5Screate_simple(int(count.size()), count.data(), nullptr),
                           "H5Screate_simple", d.where);
      h5::check(H5Dread(d.dataset.get(), type.get(), mspace.get(), fspace.get(), H5P_DEFAULT,
                        target.data_ptr()),
                "H5Dread", d.where,
                detail::concat("reading the region at ", offset, " of size ", counts));
    }
  }
  if (!direct) dest.copy_(target);
}

}  // namespace mt::checkpoint
