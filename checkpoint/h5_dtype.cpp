// DType <-> HDF5 type and attribute name (see h5_dtype.h).
#include "checkpoint/h5_dtype.h"

#include <array>
#include <cstdint>

#include "runtime/core/error.h"

namespace mt::checkpoint {
namespace {

using runtime::DType;

struct Entry {
  DType dtype;
  const char* name;
};
constexpr std::array<Entry, runtime::kNumDTypes> kNames = {{
    {DType::F32, "float32"},
    {DType::F64, "float64"},
    {DType::BF16, "bfloat16"},
    {DType::F16, "float16"},
    {DType::I32, "int32"},
    {DType::I64, "int64"},
    {DType::Bool, "bool"},
}};

constexpr const char* kWhere = "checkpoint dtype";

// A 2-byte float with the given exponent and mantissa widths (sign in bit 15).
h5::Datatype float16_type(size_t exponent_bits, size_t mantissa_bits, size_t bias) {
  h5::Datatype t(H5Tcopy(H5T_IEEE_F32LE), "H5Tcopy", kWhere);
  // Fields first, then the size (the fields must fit the size), then the bias.
  h5::check(H5Tset_fields(t.get(), 15, mantissa_bits, exponent_bits, 0, mantissa_bits),
            "H5Tset_fields", kWhere);
  h5::check(H5Tset_size(t.get(), 2), "H5Tset_size", kWhere);
  h5::check(H5Tset_ebias(t.get(), bias), "H5Tset_ebias", kWhere);
  return t;
}

h5::Datatype bool_type() {
  h5::Datatype t(H5Tenum_create(H5T_NATIVE_INT8), "H5Tenum_create", kWhere);
  const int8_t no = 0, yes = 1;
  h5::check(H5Tenum_insert(t.get(), "FALSE", &no), "H5Tenum_insert", kWhere);
  h5::check(H5Tenum_insert(t.get(), "TRUE", &yes), "H5Tenum_insert", kWhere);
  return t;
}

H5T_class_t expected_class(DType dtype) {
  switch (dtype) {
    case DType::F32:
    case DType::F64:
    case DType::BF16:
    case DType::F16: return H5T_FLOAT;
    case DType::I32:
    case DType::I64: return H5T_INTEGER;
    case DType::Bool: return H5T_ENUM;
  }
  MT_FAIL("checkpoint: unknown dtype");
}

const char* kind_name(H5T_class_t cls) {
  switch (cls) {
    case H5T_FLOAT: return "float";
    case H5T_INTEGER: return "integer";
    case H5T_ENUM: return "enum";
    default: return "non-numeric type";
  }
}

}  // namespace

std::string_view storage_dtype_name(DType dtype) {
  for (const Entry& e : kNames) {
    if (e.dtype == dtype) return e.name;
  }
  MT_FAIL("checkpoint: unknown dtype ", static_cast<int>(dtype));
}

DType dtype_from_storage_name(std::string_view name, const std::string& where) {
  std::string valid;
  for (const Entry& e : kNames) {
    if (name == e.name) return e.dtype;
    valid += valid.empty() ? "" : ", ";
    valid += e.name;
  }
  MT_FAIL(where, ": attribute 'dtype' is '", name, "', expected one of ", valid);
}

void check_weight_dtype(DType dtype, const std::string& where) {
  MT_CHECK(runtime::is_floating(dtype), where, ": ", storage_dtype_name(dtype),
           " is not a floating dtype (the weights would be truncated); expected float32, "
           "bfloat16, float16 or float64");
}

h5::Datatype hdf5_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return h5::Datatype(H5Tcopy(H5T_IEEE_F32LE), "H5Tcopy", kWhere);
    case DType::F64: return h5::Datatype(H5Tcopy(H5T_IEEE_F64LE), "H5Tcopy", kWhere);
    case DType::BF16: return float16_type(8, 7, 127);
    case DType::F16: return float16_type(5, 10, 15);
    case DType::I32: return h5::Datatype(H5Tcopy(H5T_STD_I32LE), "H5Tcopy", kWhere);
    case DType::I64: return h5::Datatype(H5Tcopy(H5T_STD_I64LE), "H5Tcopy", kWhere);
    case DType::Bool: return bool_type();
  }
  MT_FAIL("checkpoint: unknown dtype ", static_cast<int>(dtype));
}

void check_stored_type(hid_t stored, DType dtype, const std::string& where) {
  const H5T_class_t cls = H5Tget_class(stored);
  const size_t size = H5Tget_size(stored);
  MT_CHECK(cls == expected_class(dtype) && size == runtime::dtype_size(dtype), where,
           ": attribute 'dtype' says ", storage_dtype_name(dtype), " (", runtime::dtype_size(dtype),
           "-byte ", kind_name(expected_class(dtype)), ") but the data is stored as a ", size,
           "-byte ", kind_name(cls));
}

}  // namespace mt::checkpoint
