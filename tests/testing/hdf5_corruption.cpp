// flip_dataset_byte (see hdf5_corruption.h).
#include "tests/testing/hdf5_corruption.h"

#include <fstream>

#include "checkpoint/h5_file.h"
#include "runtime/core/error.h"
#include "runtime/io/hdf5.h"

namespace mt::testing {

void flip_dataset_byte(const std::filesystem::path& path, const std::string& dataset, size_t at) {
  haddr_t offset = HADDR_UNDEF;
  {
    h5::File file = checkpoint::open_file(path);
    h5::Lock lock;
    h5::Dataset d(H5Dopen2(file.get(), dataset.c_str(), H5P_DEFAULT), "H5Dopen2", path.string(),
                  dataset);
    offset = H5Dget_offset(d.get());
  }
  MT_CHECK(offset != HADDR_UNDEF, path.string(), ": dataset ", dataset, " has no stored data");
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  MT_CHECK(bool(f), path.string(), ": cannot be opened for writing");
  char c = 0;
  f.seekg(std::streamoff(offset + at));
  f.read(&c, 1);
  c = char(c ^ 0x10);
  f.seekp(std::streamoff(offset + at));
  f.write(&c, 1);
}

}  // namespace mt::testing
