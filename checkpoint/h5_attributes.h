// Attributes of checkpoint HDF5 objects (datasets, groups, the root group): strings, int64
// vectors and uint64 scalars, read back with checks that name the object and the attribute.
//
// Strings are stored as variable-length UTF-8, so h5py returns them as `str`. Int64 vectors are
// 1-D H5T_STD_I64LE arrays; an empty vector (the shape of a 0-d tensor) is an empty array.
// `where` names the object in messages, e.g. "checkpoint file /ckpt/step-10/rank-0.h5, dataset
// /model/w". Callers hold h5::Lock (these helpers make HDF5 calls and do not take it).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mt::checkpoint {

void write_string_attr(hid_t obj, const char* name, const std::string& value,
                       const std::string& where);
void write_i64s_attr(hid_t obj, const char* name, const std::vector<int64_t>& values,
                     const std::string& where);
void write_u64_attr(hid_t obj, const char* name, uint64_t value, const std::string& where);

bool has_attr(hid_t obj, const char* name, const std::string& where);
// Each throws naming `where` and the attribute when it is missing or of another kind.
std::string read_string_attr(hid_t obj, const char* name, const std::string& where);
std::vector<int64_t> read_i64s_attr(hid_t obj, const char* name, const std::string& where);
uint64_t read_u64_attr(hid_t obj, const char* name, const std::string& where);

}  // namespace mt::checkpoint
