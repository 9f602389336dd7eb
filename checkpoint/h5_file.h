// Checkpoint HDF5 files, and the small pieces every checkpoint reader and writer shares: how a
// file and a dataset are named in messages, whether a path exists, shapes as dataspaces.
//
// create_file / open_file / file_name take h5::Lock themselves; the other helpers expect the
// caller to hold it (they are building blocks of functions that do).
#pragma once

#include <hdf5.h>

#include <filesystem>
#include <string>

#include "runtime/core/shape.h"
#include "runtime/io/hdf5.h"

namespace mt::checkpoint {

// Creates (truncating) or opens a checkpoint file; errors name the path.
h5::File create_file(const std::filesystem::path& path);
h5::File open_file(const std::filesystem::path& path, bool writable = false);
// The name `obj` (a file or any object in it) was opened with.
std::string file_name(hid_t obj);

// "checkpoint file F, dataset P": the prefix of every message about one dataset.
std::string dataset_where(hid_t file, const std::string& path);

// Whether every component of `path` ("/a/b/c" or "a/b/c") exists, without HDF5 errors for
// missing intermediate groups.
bool path_exists(hid_t file, const std::string& path);

// A link creation property list that creates missing intermediate groups.
h5::PropList intermediate_groups_lcpl(const std::string& where);

// A scalar dataspace for a 0-d shape, else a simple one (zero-sized dimensions allowed).
h5::Dataspace dataspace_of(const runtime::Shape& shape, const std::string& where);

// The shape of a dataset's dataspace ({} for a scalar).
runtime::Shape dataset_shape(hid_t dataset, const std::string& where);

}  // namespace mt::checkpoint
