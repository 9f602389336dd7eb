// Writing and reading the index file (see index.h).
#include "checkpoint/index.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "checkpoint/checksum.h"
#include "checkpoint/h5_attributes.h"
#include "checkpoint/h5_dtype.h"
#include "checkpoint/h5_file.h"
#include "checkpoint/h5_virtual.h"
#include "runtime/core/error.h"

namespace mt::checkpoint {

namespace fs = std::filesystem;
using runtime::Shape;

namespace {

constexpr const char* kFormatName = "minititan-checkpoint";

h5::Datatype vlen_string_type(const std::string& where) {
  h5::Datatype t(H5Tcopy(H5T_C_S1), "H5Tcopy", where);
  h5::check(H5Tset_size(t.get(), H5T_VARIABLE), "H5Tset_size", where);
  h5::check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset", where);
  return t;
}

// Creates dataset `path` of `type` and shape `dims` (intermediate groups included), writes `data`.
void write_dataset(hid_t file, const std::string& path, hid_t type, const Shape& dims,
                   const void* data, const std::string& where) {
  h5::Dataspace space = dataspace_of(dims, where);
  h5::PropList lcpl = intermediate_groups_lcpl(where);
  h5::Dataset d(H5Dcreate2(file, path.c_str(), type, space.get(), lcpl.get(), H5P_DEFAULT,
                           H5P_DEFAULT),
                "H5Dcreate2", where, path);
  h5::check(H5Dwrite(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite", where, path);
}

void write_strings(hid_t file, const std::string& path, const std::vector<std::string>& values,
                   const std::string& where) {
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  h5::Datatype t = vlen_string_type(where);
  write_dataset(file, path, t.get(), {int64_t(values.size())}, ptrs.data(), where);
}

std::vector<std::string> read_strings(hid_t file, const std::string& path, size_t n,
                                      const std::string& where) {
  h5::Dataset d(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "H5Dopen2", where, path);
  h5::Datatype t = vlen_string_type(where);
  MT_CHECK(dataset_shape(d.get(), where) == Shape{int64_t(n)}, where, ": ", path, " should hold ",
           n, " strings");
  std::vector<char*> ptrs(n, nullptr);
  h5::check(H5Dread(d.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), "H5Dread",
            where, path);
  std::vector<std::string> out;
  for (char* p : ptrs) out.emplace_back(p ? p : "");
  h5::Dataspace space(H5Dget_space(d.get()), "H5Dget_space", where, path);
  H5Dvlen_reclaim(t.get(), space.get(), H5P_DEFAULT, ptrs.data());
  return out;
}

std::vector<int64_t> read_i64s(hid_t file, const std::string& path, const Shape& expect,
                               const std::string& where) {
  h5::Dataset d(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "H5Dopen2", where, path);
  MT_CHECK(dataset_shape(d.get(), where) == expect, where, ": ", path, " has an unexpected shape");
  std::vector<int64_t> out(size_t(runtime::numel_of(expect)));
  if (!out.empty()) {
    h5::check(H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()),
              "H5Dread", where, path);
  }
  return out;
}

void write_value(hid_t file, const std::string& key, const Value& value, const std::string& where) {
  const std::string path = "/state/" + key;
  if (const auto* i = std::get_if<int64_t>(&value)) {
    write_dataset(file, path, H5T_NATIVE_INT64, {}, i, where);
  } else if (const auto* f = std::get_if<double>(&value)) {
    write_dataset(file, path, H5T_NATIVE_DOUBLE, {}, f, where);
  } else {
    const char* s = std::get<std::string>(value).c_str();
    h5::Datatype t = vlen_string_type(where);
    write_dataset(file, path, t.get(), {}, &s, where);
  }
}

struct VisitContext {
  Values* values;
  std::string where;
  std::string error;
};

herr_t read_value(hid_t group, const char* name, const H5O_info_t* info, void* data) {
  auto* ctx = static_cast<VisitContext*>(data);
  if (info->type != H5O_TYPE_DATASET) return 0;
  try {
    h5::Dataset d(H5Dopen2(group, name, H5P_DEFAULT), "H5Dopen2", ctx->where, name);
    h5::Datatype type(H5Dget_type(d.get()), "H5Dget_type", ctx->where, name);
    const H5T_class_t cls = H5Tget_class(type.get());
    Value v;
    if (cls == H5T_INTEGER) {
      int64_t x = 0;
      h5::check(H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &x), "H5Dread",
                ctx->where, name);
      v = x;
    } else if (cls == H5T_FLOAT) {
      double x = 0;
      h5::check(H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &x), "H5Dread",
                ctx->where, name);
      v = x;
    } else if (cls == H5T_STRING) {
      h5::Datatype t = vlen_string_type(ctx->where);
      char* s = nullptr;
      h5::check(H5Dread(d.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &s), "H5Dread",
                ctx->where, name);
      v = std::string(s ? s : "");
      h5::Dataspace space(H5Screate(H5S_SCALAR), "H5Screate", ctx->where);
      H5Dvlen_reclaim(t.get(), space.get(), H5P_DEFAULT, &s);
    } else {
      MT_FAIL(ctx->where, ": state value /state/", name, " is not an integer, float or string");
    }
    (*ctx->values)[name] = v;
  } catch (const Error& e) {
    ctx->error = e.what();
    return -1;
  }
  return 0;
}

}  // namespace

std::string tensor_view_path(const std::string& fqn) { return "/tensors/" + fqn; }

void write_values(hid_t file, const Values& values, const std::string& where) {
  for (const auto& [key, value] : values) write_value(file, key, value, where);
}

namespace {

void write_seals(hid_t f, const std::vector<RankFileSeal>& seals, const std::string& where) {
  if (seals.empty()) return;
  std::vector<std::string> names;
  std::vector<int64_t> sizes, sums, counts, offsets, lengths;
  for (const RankFileSeal& s : seals) {
    names.push_back(s.file);
    sizes.push_back(s.size);
    sums.push_back(int64_t(s.metadata_xxh64));  // the bits of the uint64
    counts.push_back(int64_t(s.data.size()));
    for (const FileExtent& e : s.data) {
      offsets.push_back(e.offset);
      lengths.push_back(e.size);
    }
  }
  const Shape n{int64_t(seals.size())}, m{int64_t(offsets.size())};
  write_strings(f, "/files/name", names, where);
  write_dataset(f, "/files/size", H5T_NATIVE_INT64, n, sizes.data(), where);
  write_dataset(f, "/files/metadata_xxh64", H5T_NATIVE_INT64, n, sums.data(), where);
  write_dataset(f, "/files/extent_count", H5T_NATIVE_INT64, n, counts.data(), where);
  write_dataset(f, "/files/extent_offset", H5T_NATIVE_INT64, m, offsets.data(), where);
  write_dataset(f, "/files/extent_size", H5T_NATIVE_INT64, m, lengths.data(), where);
}

std::vector<RankFileSeal> read_seals(hid_t f, const std::string& where) {
  std::vector<RankFileSeal> seals;
  if (!path_exists(f, "/files/name")) return seals;
  h5::Dataset names_set(H5Dopen2(f, "/files/name", H5P_DEFAULT), "H5Dopen2", where, "/files/name");
  const Shape count = dataset_shape(names_set.get(), where);
  MT_CHECK(count.size() == 1, where, ": /files/name is not a list");
  const Shape n{count[0]};
  const std::vector<std::string> names = read_strings(f, "/files/name", size_t(n[0]), where);
  const std::vector<int64_t> sizes = read_i64s(f, "/files/size", n, where);
  const std::vector<int64_t> sums = read_i64s(f, "/files/metadata_xxh64", n, where);
  const std::vector<int64_t> counts = read_i64s(f, "/files/extent_count", n, where);
  int64_t m = 0;
  for (int64_t c : counts) {
    MT_CHECK(c >= 0, where, ": /files/extent_count holds ", c);
    m += c;
  }
  const std::vector<int64_t> offsets = read_i64s(f, "/files/extent_offset", {m}, where);
  const std::vector<int64_t> lengths = read_i64s(f, "/files/extent_size", {m}, where);
  size_t at = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    RankFileSeal s{names[i], sizes[i], uint64_t(sums[i]), {}};
    for (int64_t j = 0; j < counts[i]; ++j, ++at) s.data.push_back({offsets[at], lengths[at]});
    seals.push_back(std::move(s));
  }
  return seals;
}

uint64_t file_xxh64(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(bool(in), "checkpoint index ", path.string(), ": cannot be opened");
  Xxh64 hash;
  std::vector<char> buffer(size_t(1) << 20);
  while (in) {
    in.read(buffer.data(), std::streamsize(buffer.size()));
    hash.update(buffer.data(), size_t(in.gcount()));
  }
  MT_CHECK(in.eof(), "checkpoint index ", path.string(), ": read error");
  return hash.digest();
}

std::string hex16(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

void write_index_hdf5(const fs::path& path, const Index& index) {
  h5::File file = create_file(path);
  h5::Lock lock;
  const std::string where = "checkpoint index " + path.string();
  hid_t f = file.get();
  write_string_attr(f, "format", kFormatName, where);
  write_i64s_attr(f, "format_version", {kFormatVersion}, where);

  // The chunk table.
  const size_t n = index.chunks.size();
  size_t max_dim = 1;
  for (const IndexChunk& c : index.chunks) max_dim = std::max(max_dim, c.meta.global_shape.size());
  std::vector<std::string> fqns, dtypes, files, datasets;
  std::vector<int64_t> ndim, gshape(n * max_dim, 0), offset(n * max_dim, 0), sizes(n * max_dim, 0);
  for (size_t i = 0; i < n; ++i) {
    const IndexChunk& c = index.chunks[i];
    fqns.push_back(c.meta.fqn);
    dtypes.emplace_back(storage_dtype_name(c.meta.dtype));
    files.push_back(c.file);
    datasets.push_back(c.dataset);
    ndim.push_back(int64_t(c.meta.global_shape.size()));
    std::copy(c.meta.global_shape.begin(), c.meta.global_shape.end(), gshape.begin() + i * max_dim);
    std::copy(c.meta.offset.begin(), c.meta.offset.end(), offset.begin() + i * max_dim);
    std::copy(c.meta.sizes.begin(), c.meta.sizes.end(), sizes.begin() + i * max_dim);
  }
  write_strings(f, "/chunks/fqn", fqns, where);
  write_strings(f, "/chunks/dtype", dtypes, where);
  write_strings(f, "/chunks/file", files, where);
  write_strings(f, "/chunks/dataset", datasets, where);
  write_dataset(f, "/chunks/ndim", H5T_NATIVE_INT64, {int64_t(n)}, ndim.data(), where);
  const Shape table{int64_t(n), int64_t(max_dim)};
  write_dataset(f, "/chunks/global_shape", H5T_NATIVE_INT64, table, gshape.data(), where);
  write_dataset(f, "/chunks/offset", H5T_NATIVE_INT64, table, offset.data(), where);
  write_dataset(f, "/chunks/sizes", H5T_NATIVE_INT64, table, sizes.data(), where);

  // One virtual dataset per tensor.
  std::map<std::string, std::vector<const IndexChunk*>> by_tensor;
  for (const IndexChunk& c : index.chunks) by_tensor[c.meta.fqn].push_back(&c);
  for (const auto& [fqn, chunks] : by_tensor) {
    std::vector<VirtualSource> sources;
    for (const IndexChunk* c : chunks) {
      if (runtime::numel_of(c->meta.sizes) == 0 && !c->meta.sizes.empty()) continue;
      sources.push_back({c->file, c->dataset, c->meta.offset, c->meta.sizes});
    }
    create_virtual_dataset(f, tensor_view_path(fqn), chunks[0]->meta.dtype,
                           chunks[0]->meta.global_shape, sources);
  }
  write_values(f, index.values, where);
  write_seals(f, index.files, where);
  h5::check(H5Fflush(f, H5F_SCOPE_GLOBAL), "H5Fflush", where);
}

}  // namespace

fs::path index_checksum_path(const fs::path& index_path) {
  return fs::path(index_path.string() + kIndexChecksumSuffix);
}

IndexChecksum verify_index_checksum(const fs::path& index_path) {
  const fs::path sum_path = index_checksum_path(index_path);
  std::error_code ec;
  if (!fs::exists(sum_path, ec)) return IndexChecksum::Absent;
  std::ifstream in(sum_path);
  std::string saved;
  in >> saved;
  MT_CHECK(saved.size() == 16 && saved.find_first_not_of("0123456789abcdef") == std::string::npos,
           "checkpoint index ", index_path.string(), ": its checksum file ", sum_path.string(),
           " is damaged (expected 16 hex digits)");
  const std::string actual = hex16(file_xxh64(index_path));
  MT_CHECK(actual == saved, "checkpoint index ", index_path.string(),
           " is damaged: its XXH64 is ", actual, ", ", sum_path.filename().string(), " says ",
           saved, "; nothing was read from it (restore it, or load an earlier step)");
  return IndexChecksum::Verified;
}

void write_index(const fs::path& path, const Index& index) {
  write_index_hdf5(path, index);  // closed before it is hashed
  std::ofstream out(index_checksum_path(path), std::ios::trunc);
  out << hex16(file_xxh64(path)) << "  " << path.filename().string() << "\n";
  out.close();
  MT_CHECK(bool(out), "checkpoint index ", path.string(), ": cannot write its checksum file");
}

Index read_index(const fs::path& path) {
  const bool verified = verify_index_checksum(path) == IndexChecksum::Verified;
  h5::File file = open_file(path);
  h5::Lock lock;
  const std::string where = "checkpoint index " + path.string();
  hid_t f = file.get();
  MT_CHECK(has_attr(f, "format", where) && read_string_attr(f, "format", where) == kFormatName,
           where, ": not a minititan checkpoint index (no format = \"", kFormatName,
           "\" attribute)");
  const std::vector<int64_t> version = read_i64s_attr(f, "format_version", where);
  MT_CHECK(version.size() == 1 && version[0] >= 1 && version[0] <= kFormatVersion, where,
           ": format version ", version.empty() ? -1 : version[0], " is not one this build reads (",
           kFormatVersion, " or older); use a newer minititan");
  MT_CHECK(path_exists(f, "/chunks/fqn"), where, ": no chunk table (/chunks)");
  h5::Dataset fqn_set(H5Dopen2(f, "/chunks/fqn", H5P_DEFAULT), "H5Dopen2", where, "/chunks/fqn");
  const Shape count = dataset_shape(fqn_set.get(), where);
  MT_CHECK(count.size() == 1, where, ": /chunks/fqn is not a list");
  const size_t n = size_t(count[0]);
  const std::vector<std::string> fqns = read_strings(f, "/chunks/fqn", n, where);
  const std::vector<std::string> dtypes = read_strings(f, "/chunks/dtype", n, where);
  const std::vector<std::string> files = read_strings(f, "/chunks/file", n, where);
  const std::vector<std::string> datasets = read_strings(f, "/chunks/dataset", n, where);
  const std::vector<int64_t> ndim = read_i64s(f, "/chunks/ndim", {int64_t(n)}, where);
  h5::Dataset shape_set(H5Dopen2(f, "/chunks/sizes", H5P_DEFAULT), "H5Dopen2", where, "sizes");
  const Shape table = dataset_shape(shape_set.get(), where);
  MT_CHECK(table.size() == 2 && table[0] == int64_t(n), where, ": /chunks/sizes is malformed");
  const size_t width = size_t(table[1]);
  const std::vector<int64_t> gshape = read_i64s(f, "/chunks/global_shape", table, where);
  const std::vector<int64_t> offset = read_i64s(f, "/chunks/offset", table, where);
  const std::vector<int64_t> sizes = read_i64s(f, "/chunks/sizes", table, where);
  Index index;
  for (size_t i = 0; i < n; ++i) {
    MT_CHECK(ndim[i] >= 0 && size_t(ndim[i]) <= width, where, ": chunk ", i, " of ", fqns[i],
             " has a bad ndim ", ndim[i]);
    const auto row = [&](const std::vector<int64_t>& v) {
      return Shape(v.begin() + i * width, v.begin() + i * width + ndim[i]);
    };
    IndexChunk c;
    c.meta.fqn = fqns[i];
    c.meta.dtype = dtype_from_storage_name(dtypes[i], where + ", chunk of " + fqns[i]);
    c.meta.global_shape = row(gshape);
    c.meta.offset = row(offset);
    c.meta.sizes = row(sizes);
    c.file = files[i];
    c.dataset = datasets[i];
    index.chunks.push_back(std::move(c));
  }
  if (path_exists(f, "/state")) {
    VisitContext ctx{&index.values, where, ""};
    h5::Handle<H5Gclose> group(H5Gopen2(f, "/state", H5P_DEFAULT), "H5Gopen2", where, "/state");
    const herr_t rc = H5Ovisit(group.get(), H5_INDEX_NAME, H5_ITER_INC, read_value, &ctx);
    if (!ctx.error.empty()) MT_FAIL(ctx.error);
    h5::check(rc, "H5Ovisit", where, "/state");
  }
  index.files = read_seals(f, where);
  index.checksum_verified = verified;
  return index;
}

void verify_rank_files(const fs::path& dir, const Index& index) {
  std::set<std::string> named;
  for (const IndexChunk& c : index.chunks) named.insert(c.file);
  for (const std::string& f : named) {
    MT_CHECK(fs::exists(dir / f), "checkpoint ", dir.string(), ": rank file ", f,
             " named by the index is missing");
  }
  for (const RankFileSeal& seal : index.files) verify_rank_file(dir, seal);
}

}  // namespace mt::checkpoint
