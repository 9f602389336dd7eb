// inspect / read_whole_tensor / consolidate (see consolidate.h).
#include "checkpoint/consolidate.h"

#include <iomanip>
#include <map>
#include <set>

#include "checkpoint/h5_dtype.h"
#include "checkpoint/h5_file.h"
#include "checkpoint/h5_tensor.h"
#include "runtime/core/error.h"

namespace mt::checkpoint {

namespace fs = std::filesystem;
using runtime::Tensor;

namespace {

std::string human_bytes(int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2);
  if (bytes >= (int64_t(1) << 30)) {
    s << double(bytes) / double(int64_t(1) << 30) << " GiB";
  } else if (bytes >= (int64_t(1) << 20)) {
    s << double(bytes) / double(int64_t(1) << 20) << " MiB";
  } else if (bytes >= 1024) {
    s << double(bytes) / 1024.0 << " KiB";
  } else {
    s << bytes << " B";
  }
  return s.str();
}

}  // namespace

CheckpointSummary inspect_checkpoint(const fs::path& dir, bool verify) {
  CheckpointSummary s;
  s.dir = dir;
  s.index = read_index(dir / kIndexFileName);  // hashes index.h5 once, before HDF5 reads it
  s.index_checksum = s.index.checksum_verified ? IndexChecksum::Verified : IndexChecksum::Absent;
  verify_rank_files(dir, s.index);
  std::map<std::string, TensorSummary> by_name;
  std::set<std::string> files;
  for (const IndexChunk& c : s.index.chunks) {
    TensorSummary& t = by_name[c.meta.fqn];
    t.fqn = c.meta.fqn;
    t.dtype = c.meta.dtype;
    t.shape = c.meta.global_shape;
    t.bytes += c.meta.bytes();
    t.chunks += 1;
    if (t.files.empty() || t.files.back() != c.file) t.files.push_back(c.file);
    s.total_bytes += c.meta.bytes();
    files.insert(c.file);
    if (!verify) continue;
    try {
      h5::File f = open_file(dir / c.file);
      verify_checksum(f.get(), c.dataset);
    } catch (const Error& e) {
      s.checksum_errors.push_back(e.what());
    }
  }
  for (auto& [name, t] : by_name) s.tensors.push_back(std::move(t));
  s.rank_files = int(files.size());
  return s;
}

void print_summary(const CheckpointSummary& s, std::ostream& out) {
  out << "checkpoint " << s.dir.string() << "\n";
  for (const auto& [key, v] : s.index.values) {
    if (key == "config" || key == "architecture") continue;  // long; h5dump or consolidate
    out << "  " << key << " = ";
    std::visit([&](const auto& x) { out << x; }, v);
    out << "\n";
  }
  size_t width = 4;
  for (const TensorSummary& t : s.tensors) width = std::max(width, t.fqn.size());
  out << "  " << std::left << std::setw(int(width)) << "name" << "  " << std::setw(8) << "dtype"
      << "  " << std::setw(22) << "shape" << std::setw(12) << "size" << std::setw(8) << "chunks"
      << "files\n";
  for (const TensorSummary& t : s.tensors) {
    std::ostringstream shape;
    runtime::operator<<(shape, t.shape);
    std::ostringstream files;
    for (size_t i = 0; i < t.files.size(); ++i) files << (i ? "," : "") << t.files[i];
    out << "  " << std::left << std::setw(int(width)) << t.fqn << "  " << std::setw(8)
        << storage_dtype_name(t.dtype) << "  " << std::setw(22) << shape.str() << std::setw(12)
        << human_bytes(t.bytes) << std::setw(8) << t.chunks << files.str() << "\n";
  }
  out << "  " << s.tensors.size() << " tensors, " << human_bytes(s.total_bytes) << " in "
      << s.rank_files << " rank file" << (s.rank_files == 1 ? "" : "s") << "\n";
  out << "  index: "
      << (s.index_checksum == IndexChecksum::Verified
              ? "checksum verified\n"
              : "no checksum file (written before minititan kept one): not verified\n");
  if (s.checksum_errors.empty()) {
    out << "  checksums: all " << s.index.chunks.size() << " chunks verified\n";
  } else {
    out << "  checksums: " << s.checksum_errors.size() << " of " << s.index.chunks.size()
        << " chunks FAILED:\n";
    for (const std::string& e : s.checksum_errors) out << "    " << e << "\n";
  }
}

Tensor read_whole_tensor(const fs::path& dir, const std::string& fqn) {
  const Index index = read_index(dir / kIndexFileName);
  verify_rank_files(dir, index);
  for (const IndexChunk& c : index.chunks) {
    if (c.meta.fqn != fqn) continue;
    h5::File f = open_file(dir / kIndexFileName);
    return read_hyperslab(f.get(), tensor_view_path(fqn),
                          runtime::Shape(c.meta.global_shape.size(), 0), c.meta.global_shape);
  }
  MT_FAIL("checkpoint ", dir.string(), ": no tensor named ", fqn);
}

void consolidate_checkpoint(const fs::path& dir, const fs::path& out,
                            std::optional<runtime::DType> dtype) {
  if (dtype) check_weight_dtype(*dtype, "consolidate --dtype");
  const CheckpointSummary s = inspect_checkpoint(dir, /*verify=*/true);
  MT_CHECK(s.checksum_errors.empty(), "consolidate: checkpoint ", dir.string(),
           " is corrupted: ", s.checksum_errors.front());
  MT_CHECK(!fs::exists(out), "consolidate: ", out.string(),
           " already exists; name a new file (nothing was written)");
  const fs::path tmp = fs::path(out.string() + ".tmp");
  try {
    h5::File file = create_file(tmp);
    h5::File index = open_file(dir / kIndexFileName);
    for (const TensorSummary& t : s.tensors) {
      Tensor whole = read_hyperslab(index.get(), tensor_view_path(t.fqn),
                                    runtime::Shape(t.shape.size(), 0), t.shape);
      if (dtype && runtime::is_floating(whole.dtype())) whole = whole.to(*dtype);
      write_tensor(file.get(), tensor_view_path(t.fqn), whole,
                   {t.fqn, t.shape, runtime::Shape(t.shape.size(), 0)});
    }
    h5::Lock lock;
    write_values(file.get(), s.index.values, "consolidated checkpoint " + tmp.string());
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);  // a failed write (disk full, ...) leaves nothing behind
    throw;
  }
  fs::rename(tmp, out);
}

}  // namespace mt::checkpoint
