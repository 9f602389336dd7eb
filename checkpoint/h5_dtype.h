// How each minititan DType is stored in checkpoint HDF5 files, and its name in the `dtype`
// attribute every tensor dataset carries.
//
//   DType  attribute   HDF5 type
//   F32    "float32"   H5T_IEEE_F32LE
//   F64    "float64"   H5T_IEEE_F64LE
//   BF16   "bfloat16"  2-byte float, sign bit 15, exponent bits 7-14 (bias 127), mantissa 0-6
//   F16    "float16"   2-byte IEEE half: sign 15, exponent 10-14 (bias 15), mantissa 0-9
//   I32    "int32"     H5T_STD_I32LE
//   I64    "int64"     H5T_STD_I64LE
//   Bool   "bool"      enum of int8 {FALSE = 0, TRUE = 1} (h5py's convention: reads as bool)
//
// The custom float types let HDF5 convert to any float, so h5py reads bf16 data as real numbers
// (HDF5 converts them to float32), not as raw uint16. The names are numpy's and PyTorch's.
// Tensors are read by the `dtype` attribute; the stored HDF5 type is only sanity-checked (class
// and size), since two dtypes can share one (bf16 and f16 are both 2-byte floats).
#pragma once

#include <hdf5.h>

#include <string>
#include <string_view>

#include "runtime/core/dtype.h"
#include "runtime/io/hdf5.h"

namespace mt::checkpoint {

std::string_view storage_dtype_name(runtime::DType dtype);
// Throws naming `where`, the name found and the valid names.
runtime::DType dtype_from_storage_name(std::string_view name, const std::string& where);
// Throws naming `where` unless `dtype`, asked for a checkpoint's weights (--dtype), is a floating
// one: an integer or bool dtype would truncate them (to zeros, for trained weights).
void check_weight_dtype(runtime::DType dtype, const std::string& where);

// The HDF5 type of `dtype`, both on disk and in memory (so reads and writes never convert).
// The caller holds h5::Lock.
h5::Datatype hdf5_type(runtime::DType dtype);

// Throws naming `where` when `stored` (a dataset's HDF5 type) cannot hold `dtype` as written by
// hdf5_type(): another class (float, integer, enum) or another size.
void check_stored_type(hid_t stored, runtime::DType dtype, const std::string& where);

}  // namespace mt::checkpoint
