// HDF5 token files: writer (block appends to a chunked dataset) and reader (hyperslab reads).
#include "data/dataset/token_file.h"

#include <bit>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <system_error>

#include "runtime/io/hdf5.h"
#include "runtime/core/error.h"
#include "runtime/core/rng.h"

namespace mt::data {
namespace fs = std::filesystem;

namespace {

constexpr const char* kTokens = "tokens";

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- attributes on the root group (loc = the file id) ------------------------------------------

void write_i64_attr(hid_t loc, const char* name, int64_t value, const std::string& file) {
  h5::Dataspace space(H5Screate(H5S_SCALAR), "H5Screate", file);
  h5::Attribute attr(H5Acreate2(loc, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     "H5Acreate2", file, std::string("attribute ") + name);
  h5::check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), "H5Awrite", file,
            std::string("attribute ") + name);
}

void write_str_attr(hid_t loc, const char* name, const std::string& value,
                    const std::string& file) {
  h5::Datatype type(H5Tcopy(H5T_C_S1), "H5Tcopy", file);
  // HDF5 rejects zero-sized string types; an empty string is stored as one NUL byte.
  h5::check(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), "H5Tset_size", file);
  h5::check(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "H5Tset_strpad", file);
  h5::Dataspace space(H5Screate(H5S_SCALAR), "H5Screate", file);
  h5::Attribute attr(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     "H5Acreate2", file, std::string("attribute ") + name);
  std::string data = value.empty() ? std::string(1, '\0') : value;
  h5::check(H5Awrite(attr.get(), type.get(), data.data()), "H5Awrite", file,
            std::string("attribute ") + name);
}

std::optional<h5::Attribute> open_attr(hid_t loc, const char* name, const std::string& file) {
  htri_t exists = h5::check(H5Aexists(loc, name), "H5Aexists", file, name);
  if (!exists) return std::nullopt;
  return h5::Attribute(H5Aopen(loc, name, H5P_DEFAULT), "H5Aopen", file,
                       std::string("attribute ") + name);
}

[[noreturn]] void missing_attr(const char* name, const std::string& file, const char* hint) {
  MT_FAIL("token file ", file, ": attribute '", name, "' is missing", hint);
}

int64_t read_i64_attr(hid_t loc, const char* name, const std::string& file, const char* hint = "") {
  auto attr = open_attr(loc, name, file);
  if (!attr) missing_attr(name, file, hint);
  h5::Datatype type(H5Aget_type(attr->get()), "H5Aget_type", file, name);
  MT_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, "token file ", file, ": attribute '", name,
           "' should be an integer");
  int64_t value = 0;
  h5::check(H5Aread(attr->get(), H5T_NATIVE_INT64, &value), "H5Aread", file,
            std::string("attribute ") + name);
  return value;
}

std::string read_str_attr(hid_t loc, const char* name, const std::string& file,
                          const char* hint = "") {
  auto attr = open_attr(loc, name, file);
  if (!attr) missing_attr(name, file, hint);
  h5::Datatype type(H5Aget_type(attr->get()), "H5Aget_type", file, name);
  MT_CHECK(H5Tget_class(type.get()) == H5T_STRING, "token file ", file, ": attribute '", name,
           "' should be a string");
  std::string out;
  if (h5::check(H5Tis_variable_str(type.get()), "H5Tis_variable_str", file, name) > 0) {
    h5::Datatype mem(H5Tcopy(H5T_C_S1), "H5Tcopy", file);
    h5::check(H5Tset_size(mem.get(), H5T_VARIABLE), "H5Tset_size", file);
    char* s = nullptr;
    h5::check(H5Aread(attr->get(), mem.get(), &s), "H5Aread", file,
              std::string("attribute ") + name);
    if (s) out = s;
    H5free_memory(s);
  } else {
    size_t n = H5Tget_size(type.get());
    out.assign(n, '\0');
    h5::check(H5Aread(attr->get(), type.get(), out.data()), "H5Aread", file,
              std::string("attribute ") + name);
    out.resize(out.find('\0') == std::string::npos ? n : out.find('\0'));
  }
  return out;
}

}  // namespace

std::string tokenizer_file_hash(const fs::path& tokenizer_json) {
  std::ifstream in(tokenizer_json, std::ios::binary);
  MT_CHECK(in, "tokenizer_file_hash: cannot read ", tokenizer_json.string());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return hex16(runtime::hash_stream_name(bytes));
}

// ---- writer
// --------------------------------------------------------------------------------------

struct TokenFileWriter::Handles {
  h5::File file;
  h5::Dataset tokens;
};

TokenFileWriter::TokenFileWriter(fs::path path, TokenizerIdentity tokenizer, int64_t eos_id,
                                 TokenFileWriterOptions options)
    : path_(std::move(path)),
      partial_path_(path_.string() + ".partial"),
      tokenizer_(std::move(tokenizer)),
      eos_id_(eos_id),
      options_(options),
      h_(std::make_unique<Handles>()) {
  const std::string file = partial_path_.string();
  MT_CHECK(tokenizer_.vocab_size > 0 && tokenizer_.vocab_size <= (int64_t{1} << 32), "token file ",
           path_.string(), ": tokenizer vocab_size must be in [1, 2^32], got ",
           tokenizer_.vocab_size);
  MT_CHECK(eos_id_ >= 0 && eos_id_ < tokenizer_.vocab_size, "token file ", path_.string(),
           ": eos_id ", eos_id_, " is outside the vocabulary [0, ", tokenizer_.vocab_size, ")");
  MT_CHECK(options_.block_tokens > 0 && options_.chunk_tokens > 0, "token file ", path_.string(),
           ": block_tokens and chunk_tokens must be positive");
  h5::Lock lock;  // every HDF5 call holds the process-wide lock (see runtime/io/hdf5.h)
  h5::silence_hdf5_errors();
  h_->file = h5::File(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "H5Fcreate",
                      file, "cannot create the file");
  hsize_t dims[1] = {0};
  hsize_t maxdims[1] = {H5S_UNLIMITED};
  h5::Dataspace space(H5Screate_simple(1, dims, maxdims), "H5Screate_simple", file);
  h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", file);
  hsize_t chunk[1] = {static_cast<hsize_t>(options_.chunk_tokens)};
  h5::check(H5Pset_chunk(dcpl.get(), 1, chunk), "H5Pset_chunk", file);
  h_->tokens = h5::Dataset(H5Dcreate2(h_->file.get(), kTokens, H5T_STD_U32LE, space.get(),
                                      H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                           "H5Dcreate2", file, "dataset 'tokens'");
  hid_t root = h_->file.get();
  write_str_attr(root, "format", kTokenFileFormat, file);
  write_i64_attr(root, "format_version", kTokenFileFormatVersion, file);
  write_i64_attr(root, "eos_id", eos_id_, file);
  write_str_attr(root, "tokenizer_path", tokenizer_.path, file);
  write_i64_attr(root, "tokenizer_vocab_size", tokenizer_.vocab_size, file);
  write_str_attr(root, "tokenizer_hash", tokenizer_.hash, file);
  write_str_attr(root, "tokenizer_fingerprint", tokenizer_.fingerprint, file);
  if (!options_.source.empty()) write_str_attr(root, "source", options_.source, file);
  buffer_.reserve(static_cast<size_t>(options_.block_tokens));
}

TokenFileWriter::~TokenFileWriter() {
  if (h_) {
    h_.reset();
    std::error_code ec;
    fs::remove(partial_path_, ec);
  }
}

void TokenFileWriter::append(std::span<const int32_t> tokens) {
  MT_CHECK(h_ != nullptr, "token file ", path_.string(), ": append after finish()");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    MT_CHECK(t >= 0 && t < tokenizer_.vocab_size, "token file ", path_.string(), ": token id ", t,
             " (document ", num_documents_, ", token ", i, ") is outside the vocabulary [0, ",
             tokenizer_.vocab_size, ")");
    buffer_.push_back(static_cast<uint32_t>(t));
    if (int64_t(buffer_.size()) >= options_.block_tokens) flush();
  }
  num_tokens_ += int64_t(tokens.size());
  in_document_ = true;
}

void TokenFileWriter::end_document() {
  MT_CHECK(h_ != nullptr, "token file ", path_.string(), ": end_document after finish()");
  buffer_.push_back(static_cast<uint32_t>(eos_id_));
  ++num_tokens_;
  ++num_documents_;
  in_document_ = false;
  if (int64_t(buffer_.size()) >= options_.block_tokens) flush();
}

void TokenFileWriter::add_document(std::span<const int32_t> tokens) {
  append(tokens);
  end_document();
}

void TokenFileWriter::flush() {
  if (buffer_.empty()) return;
  h5::Lock lock;
  const std::string file = partial_path_.string();
  const hsize_t start = static_cast<hsize_t>(num_flushed_);
  const hsize_t count = buffer_.size();
  hsize_t new_size[1] = {start + count};
  h5::check(H5Dset_extent(h_->tokens.get(), new_size), "H5Dset_extent", file, "dataset 'tokens'");
  h5::Dataspace fspace(H5Dget_space(h_->tokens.get()), "H5Dget_space", file);
  hsize_t offset[1] = {start};
  hsize_t n[1] = {count};
  h5::check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, offset, nullptr, n, nullptr),
            "H5Sselect_hyperslab", file);
  h5::Dataspace mspace(H5Screate_simple(1, n, nullptr), "H5Screate_simple", file);
  h5::check(H5Dwrite(h_->tokens.get(), H5T_NATIVE_UINT32, mspace.get(), fspace.get(), H5P_DEFAULT,
                     buffer_.data()),
            "H5Dwrite", file, "appending tokens");
  num_flushed_ += int64_t(count);
  buffer_.clear();
}

void TokenFileWriter::finish() {
  MT_CHECK(h_ != nullptr, "token file ", path_.string(), ": finish() called twice");
  h5::Lock lock;
  if (in_document_) end_document();
  flush();
  const std::string file = partial_path_.string();
  write_i64_attr(h_->file.get(), "num_documents", num_documents_, file);
  write_i64_attr(h_->file.get(), "num_tokens", num_tokens_, file);
  h_->tokens.reset();
  h5::check(H5Fflush(h_->file.get(), H5F_SCOPE_GLOBAL), "H5Fflush", file);
  h_->file.reset();
  h_.reset();
  std::error_code ec;
  fs::rename(partial_path_, path_, ec);
  MT_CHECK(!ec, "token file ", path_.string(), ": cannot rename ", file,
           " into place: ", ec.message());
}

// ---- reader
// --------------------------------------------------------------------------------------

struct TokenFileReader::Handles {
  h5::File file;
  h5::Dataset tokens;
  bool signed_ids = false;  // i32: read as such, and refused where negative
};

TokenFileReader::TokenFileReader(const fs::path& path) : h_(std::make_unique<Handles>()) {
  const std::string file = path.string();
  info_.path = path;
  std::error_code ec;
  MT_CHECK(fs::exists(path, ec), "token file ", file, ": no such file");
  MT_CHECK(!fs::is_directory(path, ec), "token file ", file, ": is a directory, not a file");
  h5::Lock lock;  // every HDF5 call holds the process-wide lock (see runtime/io/hdf5.h)
  h5::silence_hdf5_errors();
  hid_t fid = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  MT_CHECK(fid >= 0, "token file ", file, ": cannot be opened as an HDF5 file (H5Fopen failed)");
  h_->file = h5::File(fid);
  const hid_t root = fid;
  const char* not_ours = " (not a minititan token file? make one with mt_prepare_dataset)";
  const std::string format = read_str_attr(root, "format", file, not_ours);
  MT_CHECK(format == kTokenFileFormat, "token file ", file, ": format is '", format,
           "', expected '", kTokenFileFormat, "'");
  info_.format_version = read_i64_attr(root, "format_version", file);
  MT_CHECK(info_.format_version == kTokenFileFormatVersion, "token file ", file,
           ": format_version is ", info_.format_version, ", this build reads version ",
           kTokenFileFormatVersion, " (re-create the file with this build's mt_prepare_dataset)");
  info_.eos_id = read_i64_attr(root, "eos_id", file);
  info_.tokenizer.path = read_str_attr(root, "tokenizer_path", file);
  info_.tokenizer.vocab_size = read_i64_attr(root, "tokenizer_vocab_size", file);
  info_.tokenizer.hash = read_str_attr(root, "tokenizer_hash", file);
  info_.tokenizer.fingerprint = read_str_attr(root, "tokenizer_fingerprint", file);
  const char* incomplete = " (the file is incomplete: was its writer interrupted?)";
  info_.num_documents = read_i64_attr(root, "num_documents", file, incomplete);
  info_.num_tokens = read_i64_attr(root, "num_tokens", file, incomplete);
  if (open_attr(root, "source", file)) info_.source = read_str_attr(root, "source", file);

  htri_t has = h5::check(H5Lexists(root, kTokens, H5P_DEFAULT), "H5Lexists", file);
  MT_CHECK(has > 0, "token file ", file, ": dataset 'tokens' is missing");
  // Uncompressed chunks and no chunk cache: a window read touches only its own bytes.
  h5::PropList dapl(H5Pcreate(H5P_DATASET_ACCESS), "H5Pcreate", file);
  h5::check(
      H5Pset_chunk_cache(dapl.get(), H5D_CHUNK_CACHE_NSLOTS_DEFAULT, 0, H5D_CHUNK_CACHE_W0_DEFAULT),
      "H5Pset_chunk_cache", file);
  h_->tokens =
      h5::Dataset(H5Dopen2(root, kTokens, dapl.get()), "H5Dopen2", file, "dataset 'tokens'");
  h5::Datatype type(H5Dget_type(h_->tokens.get()), "H5Dget_type", file);
  MT_CHECK(H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_size(type.get()) == 4, "token file ",
           file, ": dataset 'tokens' should hold 32-bit integers");
  h_->signed_ids = H5Tget_sign(type.get()) == H5T_SGN_2;
  h5::Dataspace space(H5Dget_space(h_->tokens.get()), "H5Dget_space", file);
  const int rank =
      h5::check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", file);
  MT_CHECK(rank == 1, "token file ", file, ": dataset 'tokens' should be 1-D, it has ", rank,
           " dimensions");
  hsize_t dims[1] = {0};
  h5::check(H5Sget_simple_extent_dims(space.get(), dims, nullptr), "H5Sget_simple_extent_dims",
            file);
  MT_CHECK(int64_t(dims[0]) == info_.num_tokens, "token file ", file, ": dataset 'tokens' holds ",
           dims[0], " tokens but attribute num_tokens says ", info_.num_tokens,
           " (truncated or damaged file)");
}

TokenFileReader::~TokenFileReader() = default;
TokenFileReader::TokenFileReader(TokenFileReader&&) noexcept = default;
TokenFileReader& TokenFileReader::operator=(TokenFileReader&&) noexcept = default;

void TokenFileReader::read(int64_t start, int64_t end, uint32_t* out) const {
  const std::string file = info_.path.string();
  MT_CHECK(0 <= start && start <= end && end <= info_.num_tokens, "token file ", file,
           ": cannot read tokens [", start, ", ", end, "), the file holds ", info_.num_tokens);
  if (start == end) return;
  h5::Lock lock;
  h5::Dataspace fspace(H5Dget_space(h_->tokens.get()), "H5Dget_space", file);
  hsize_t offset[1] = {static_cast<hsize_t>(start)};
  hsize_t n[1] = {static_cast<hsize_t>(end - start)};
  h5::check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, offset, nullptr, n, nullptr),
            "H5Sselect_hyperslab", file);
  h5::Dataspace mspace(H5Screate_simple(1, n, nullptr), "H5Screate_simple", file);
  std::ostringstream what;
  what << "reading tokens [" << start << ", " << end << ")";
  // Signed ids are read as i32 (HDF5 would clamp a negative one to 0 in a u32 read).
  h5::check(H5Dread(h_->tokens.get(), h_->signed_ids ? H5T_NATIVE_INT32 : H5T_NATIVE_UINT32,
                    mspace.get(), fspace.get(), H5P_DEFAULT, out),
            "H5Dread", file, what.str());
  if (!h_->signed_ids) return;
  for (int64_t i = 0; i < end - start; ++i) {
    const int32_t id = std::bit_cast<int32_t>(out[i]);
    MT_CHECK(id >= 0, "token file ", file, ": token id ", id, " at offset ", start + i,
             " is negative");
  }
}

std::vector<uint32_t> TokenFileReader::read(int64_t start, int64_t end) const {
  MT_CHECK(start <= end, "token file ", info_.path.string(), ": cannot read tokens [", start, ", ",
           end, ")");
  std::vector<uint32_t> out(static_cast<size_t>(end - start));
  read(start, end, out.data());
  return out;
}

}  // namespace mt::data
