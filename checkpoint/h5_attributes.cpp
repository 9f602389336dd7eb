// Attribute helpers for checkpoint files (see h5_attributes.h).
#include "checkpoint/h5_attributes.h"

#include "runtime/core/error.h"
#include "runtime/io/hdf5.h"

namespace mt::checkpoint {
namespace {

std::string attr_label(const char* name) { return std::string("attribute ") + name; }

h5::Attribute create_attr(hid_t obj, const char* name, hid_t type, hid_t space,
                          const std::string& where) {
  if (h5::check(H5Aexists(obj, name), "H5Aexists", where, attr_label(name)) > 0) {
    h5::check(H5Adelete(obj, name), "H5Adelete", where, attr_label(name));
  }
  return h5::Attribute(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), "H5Acreate2",
                       where, attr_label(name));
}

h5::Attribute open_attr(hid_t obj, const char* name, const std::string& where) {
  MT_CHECK(has_attr(obj, name, where), where, ": attribute '", name,
           "' is missing (was this written by minititan's checkpoint writer?)");
  return h5::Attribute(H5Aopen(obj, name, H5P_DEFAULT), "H5Aopen", where, attr_label(name));
}

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    case H5T_STRING: return "a string";
    case H5T_COMPOUND: return "a compound";
    case H5T_ENUM: return "an enum";
    case H5T_ARRAY: return "an array type";
    default: return "another type";
  }
}

// The attribute's element count, requiring at most one dimension.
hssize_t element_count(hid_t attr, const char* name, const std::string& where) {
  h5::Dataspace space(H5Aget_space(attr), "H5Aget_space", where, attr_label(name));
  const int rank = h5::check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims",
                             where, attr_label(name));
  MT_CHECK(rank <= 1, where, ": attribute '", name, "' should be a scalar or a 1-D array, it has ",
           rank, " dimensions");
  return h5::check(H5Sget_simple_extent_npoints(space.get()), "H5Sget_simple_extent_npoints",
                   where, attr_label(name));
}

}  // namespace

void write_string_attr(hid_t obj, const char* name, const std::string& value,
                       const std::string& where) {
  h5::Datatype type(H5Tcopy(H5T_C_S1), "H5Tcopy", where);
  h5::check(H5Tset_size(type.get(), H5T_VARIABLE), "H5Tset_size", where);
  h5::check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset", where);
  h5::Dataspace space(H5Screate(H5S_SCALAR), "H5Screate", where);
  h5::Attribute attr = create_attr(obj, name, type.get(), space.get(), where);
  const char* data = value.c_str();
  h5::check(H5Awrite(attr.get(), type.get(), &data), "H5Awrite", where, attr_label(name));
}

void write_i64s_attr(hid_t obj, const char* name, const std::vector<int64_t>& values,
                     const std::string& where) {
  hsize_t dims[1] = {values.size()};
  h5::Dataspace space(H5Screate_simple(1, dims, nullptr), "H5Screate_simple", where,
                      attr_label(name));
  h5::Attribute attr = create_attr(obj, name, H5T_STD_I64LE, space.get(), where);
  if (values.empty()) return;
  h5::check(H5Awrite(attr.get(), H5T_NATIVE_INT64, values.data()), "H5Awrite", where,
            attr_label(name));
}

void write_u64_attr(hid_t obj, const char* name, uint64_t value, const std::string& where) {
  h5::Dataspace space(H5Screate(H5S_SCALAR), "H5Screate", where);
  h5::Attribute attr = create_attr(obj, name, H5T_STD_U64LE, space.get(), where);
  h5::check(H5Awrite(attr.get(), H5T_NATIVE_UINT64, &value), "H5Awrite", where, attr_label(name));
}

bool has_attr(hid_t obj, const char* name, const std::string& where) {
  return h5::check(H5Aexists(obj, name), "H5Aexists", where, attr_label(name)) > 0;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& where) {
  h5::Attribute attr = open_attr(obj, name, where);
  h5::Datatype type(H5Aget_type(attr.get()), "H5Aget_type", where, attr_label(name));
  const H5T_class_t cls = H5Tget_class(type.get());
  MT_CHECK(cls == H5T_STRING, where, ": attribute '", name, "' should be a string, found ",
           class_name(cls));
  MT_CHECK(element_count(attr.get(), name, where) == 1, where, ": attribute '", name,
           "' should hold one string");
  if (h5::check(H5Tis_variable_str(type.get()), "H5Tis_variable_str", where, attr_label(name)) >
      0) {
    h5::Datatype mem(H5Tcopy(H5T_C_S1), "H5Tcopy", where);
    h5::check(H5Tset_size(mem.get(), H5T_VARIABLE), "H5Tset_size", where);
    h5::check(H5Tset_cset(mem.get(), H5Tget_cset(type.get())), "H5Tset_cset", where);
    char* s = nullptr;
    h5::check(H5Aread(attr.get(), mem.get(), &s), "H5Aread", where, attr_label(name));
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t n = H5Tget_size(type.get());
  std::string out(n, '\0');
  h5::check(H5Aread(attr.get(), type.get(), out.data()), "H5Aread", where, attr_label(name));
  const size_t end = out.find('\0');
  if (end != std::string::npos) out.resize(end);
  return out;
}

std::vector<int64_t> read_i64s_attr(hid_t obj, const char* name, const std::string& where) {
  h5::Attribute attr = open_attr(obj, name, where);
  h5::Datatype type(H5Aget_type(attr.get()), "H5Aget_type", where, attr_label(name));
  const H5T_class_t cls = H5Tget_class(type.get());
  MT_CHECK(cls == H5T_INTEGER, where, ": attribute '", name,
           "' should be an array of integers, found ", class_name(cls));
  std::vector<int64_t> out(static_cast<size_t>(element_count(attr.get(), name, where)));
  if (!out.empty()) {
    h5::check(H5Aread(attr.get(), H5T_NATIVE_INT64, out.data()), "H5Aread", where,
              attr_label(name));
  }
  return out;
}

uint64_t read_u64_attr(hid_t obj, const char* name, const std::string& where) {
  h5::Attribute attr = open_attr(obj, name, where);
  h5::Datatype type(H5Aget_type(attr.get()), "H5Aget_type", where, attr_label(name));
  const H5T_class_t cls = H5Tget_class(type.get());
  MT_CHECK(cls == H5T_INTEGER, where, ": attribute '", name, "' should be an unsigned integer, found ",
           class_name(cls));
  MT_CHECK(element_count(attr.get(), name, where) == 1, where, ": attribute '", name,
           "' should hold one value");
  uint64_t value = 0;
  h5::check(H5Aread(attr.get(), H5T_NATIVE_UINT64, &value), "H5Aread", where, attr_label(name));
  return value;
}

}  // namespace mt::checkpoint
