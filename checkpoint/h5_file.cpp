// Checkpoint files and shared HDF5 helpers (see h5_file.h).
#include "checkpoint/h5_file.h"

#include <system_error>
#include <vector>

#include "runtime/core/error.h"

namespace mt::checkpoint {
namespace fs = std::filesystem;

h5::File create_file(const fs::path& path) {
  h5::Lock lock;
  const std::string name = path.string();
  hid_t id = H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  MT_CHECK(id >= 0, "checkpoint file ", name,
           ": cannot be created (H5Fcreate failed; does the folder exist and is it writable?)");
  return h5::File(id);
}

h5::File open_file(const fs::path& path, bool writable) {
  const std::string name = path.string();
  std::error_code ec;
  MT_CHECK(fs::exists(path, ec), "checkpoint file ", name, ": no such file");
  MT_CHECK(!fs::is_directory(path, ec), "checkpoint file ", name,
           ": is a directory, not a file");
  h5::Lock lock;
  hid_t id = H5Fopen(name.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  MT_CHECK(id >= 0, "checkpoint file ", name,
           ": cannot be opened as an HDF5 file (H5Fopen failed; truncated or not HDF5?)");
  return h5::File(id);
}

std::string file_name(hid_t obj) {
  h5::Lock lock;
  const ssize_t n = H5Fget_name(obj, nullptr, 0);
  if (n <= 0) return "<unknown file>";
  std::string name(static_cast<size_t>(n) + 1, '\0');
  H5Fget_name(obj, name.data(), name.size());
  name.resize(static_cast<size_t>(n));
  return name;
}

std::string dataset_where(hid_t file, const std::string& path) {
  return "checkpoint file " + file_name(file) + ", dataset " + path;
}

bool path_exists(hid_t file, const std::string& path) {
  std::string prefix = path.starts_with('/') ? "/" : "";
  size_t start = prefix.size();
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) {
      prefix += path.substr(start, end - start);
      if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      prefix += '/';
    }
    start = end + 1;
  }
  return true;
}

h5::PropList intermediate_groups_lcpl(const std::string& where) {
  h5::PropList lcpl(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate", where);
  h5::check(H5Pset_create_intermediate_group(lcpl.get(), 1), "H5Pset_create_intermediate_group",
            where);
  return lcpl;
}

h5::Dataspace dataspace_of(const runtime::Shape& shape, const std::string& where) {
  if (shape.empty()) return h5::Dataspace(H5Screate(H5S_SCALAR), "H5Screate", where);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return h5::Dataspace(H5Screate_simple(int(dims.size()), dims.data(), nullptr),
                       "H5Screate_simple", where);
}

runtime::Shape dataset_shape(hid_t dataset, const std::string& where) {
  h5::Dataspace space(H5Dget_space(dataset), "H5Dget_space", where);
  const int rank =
      h5::check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", where);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) {
    h5::check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr),
              "H5Sget_simple_extent_dims", where);
  }
  return runtime::Shape(dims.begin(), dims.end());
}

}  // namespace mt::checkpoint
