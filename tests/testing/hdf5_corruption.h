// Corrupting checkpoint files on purpose: flips one bit of a dataset's stored bytes on disk, for
// tests that checksums catch damage.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace mt::testing {

// Flips bit 4 of the byte `at` bytes into the (contiguous) data of `dataset` in the HDF5 file
// `path`; flipping again restores it. Throws mt::Error when the dataset has no stored data.
void flip_dataset_byte(const std::filesystem::path& path, const std::string& dataset, size_t at);

}  // namespace mt::testing
