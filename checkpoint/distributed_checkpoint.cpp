// save_checkpoint / load_checkpoint (see distributed_checkpoint.h).
#include "checkpoint/distributed_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "checkpoint/h5_file.h"
#include "checkpoint/h5_tensor.h"
#include "checkpoint/index.h"
#include "checkpoint/save_plan.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/comm/process_group.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"

namespace mt::checkpoint {

namespace fs = std::filesystem;
using parallel::ProcessGroup;
using runtime::Tensor;

namespace {

void maybe_crash(const char* point) {
  const char* at = std::getenv("MT_CHECKPOINT_CRASH_AT");
  if (at == nullptr || std::strcmp(at, point) != 0) return;
  std::fprintf(stderr, "checkpoint: MT_CHECKPOINT_CRASH_AT=%s: exiting here\n", point);
  std::fflush(stderr);
  std::_Exit(86);
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  MT_CHECK(fd >= 0, "checkpoint: cannot open ", path.string(), " to fsync it: ",
           std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MT_CHECK(rc == 0, "checkpoint: fsync of ", path.string(), " failed: ", std::strerror(err));
}

// Runs fn; every rank learns every rank's error, and all throw the first one (so a failure on
// one rank never leaves the others waiting in the next collective).
template <class Fn>
void on_all_ranks(ProcessGroup& group, const char* name, Fn&& fn) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::vector<std::string> errors = parallel::all_gather_strings(group, error, name);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    if (int(r) == group.rank()) MT_FAIL(errors[r]);
    MT_FAIL(errors[r], " (reported by rank ", r, ")");
  }
}

// Per-rank values on the wire: key, type letter, byte length, bytes; one record after another.
std::string encode_values(const Values& values) {
  std::ostringstream out;
  for (const auto& [key, v] : values) {
    std::string text;
    char type = 's';
    if (const auto* i = std::get_if<int64_t>(&v)) {
      type = 'i';
      text = std::to_string(*i);
    } else if (const auto* d = std::get_if<double>(&v)) {
      type = 'd';
      char buf[64];
      std::snprintf(buf, sizeof buf, "%a", *d);  // exact
      text = buf;
    } else {
      text = std::get<std::string>(v);
    }
    out << key << '\n' << type << '\n' << text.size() << '\n' << text;
  }
  return out.str();
}

Values decode_values(const std::string& wire) {
  Values values;
  std::istringstream in(wire);
  std::string key, type, length;
  while (std::getline(in, key) && std::getline(in, type) && std::getline(in, length)) {
    std::string text(std::stoul(length), '\0');
    in.read(text.data(), std::streamsize(text.size()));
    if (type == "i") {
      values[key] = int64_t(std::stoll(text));
    } else if (type == "d") {
      values[key] = std::strtod(text.c_str(), nullptr);
    } else {
      values[key] = text;
    }
  }
  return values;
}

ChunkMeta meta_of(const TensorPiece& p) {
  MT_CHECK(p.local.defined(), "checkpoint: tensor ", p.fqn, " is undefined");
  MT_CHECK(p.global_offset.size() == p.global_shape.size() &&
               int64_t(p.global_shape.size()) == p.local.dim(),
           "checkpoint: tensor ", p.fqn, ": local shape ", p.local.shape(), ", global shape ",
           p.global_shape, " and offset ", p.global_offset, " do not have the same rank");
  return {p.fqn, p.local.dtype(), p.global_shape, p.global_offset, p.local.shape()};
}

std::string per_rank_key(const std::string& group, int rank) {
  return group + "/rank_" + std::to_string(rank) + "/";
}

}  // namespace

namespace {

// After a failed write, most often a full disk: " (the file system of DIR has N MiB free)".
std::string free_space_note(const fs::path& dir) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (ec) return "";
  return " (the file system of " + dir.string() + " has " +
         std::to_string(space.available >> 20) + " MiB free)";
}

}  // namespace

void save_checkpoint(const fs::path& dir, const CheckpointState& state, ProcessGroup& group) {
  const fs::path tmp = fs::path(dir.string() + ".tmp");
  const int rank = group.rank();

  // Plan (every rank computes the same plan from everyone's descriptions).
  std::vector<ChunkMeta> mine;
  for (const TensorPiece& p : state.tensors) mine.push_back(meta_of(p));
  const std::vector<std::string> gathered =
      parallel::all_gather_strings(group, encode_chunks(mine), "checkpoint.plan");
  std::vector<std::vector<ChunkMeta>> per_rank;
  for (const std::string& g : gathered) per_rank.push_back(decode_chunks(g));
  SavePlan plan;
  on_all_ranks(group, "checkpoint.plan_errors", [&] { plan = plan_save(per_rank); });
  const std::vector<std::string> rank_values = parallel::all_gather_strings(
      group, encode_values(state.per_rank_values), "checkpoint.per_rank_values");

  on_all_ranks(group, "checkpoint.prepare", [&] {
    if (rank != 0) return;
    fs::remove_all(tmp);  // a crashed save of this step
    fs::create_directories(tmp);
  });

  // A save that fails on any rank (disk full, ...) fails on every rank; its .tmp folder goes, so
  // it neither keeps filling the disk nor lingers (the previous checkpoint stays the latest).
  try {
    // Each rank writes its chunks.
    std::string seal;  // this rank's file's seal (rank_file_seal.h), for the index
    on_all_ranks(group, "checkpoint.write", [&] {
      const fs::path file_path = tmp / rank_file_name(rank);
      try {
        std::vector<FileExtent> data;
        {
          h5::File file = create_file(file_path);
          for (int index : plan.writes[size_t(rank)]) {
            const TensorPiece& p = state.tensors[size_t(index)];
            const Tensor local = p.produce ? p.produce() : p.local;  // made one at a time
            MT_CHECK(local.shape() == p.local.shape() && local.dtype() == p.local.dtype(),
                     "checkpoint: streamed tensor ", p.fqn, " produced ", local.shape(),
                     ", announced ", p.local.shape());
            data.push_back(write_tensor(file.get(), chunk_dataset_path(p.fqn), local,
                                        {p.fqn, p.global_shape, p.global_offset}));
            maybe_crash("mid_rank_file");
          }
        }
        fsync_path(file_path, false);
        seal = encode_seal(seal_rank_file(file_path, std::move(data)));
      } catch (const Error& e) {
        MT_FAIL(e.what(), free_space_note(tmp));
      }
      maybe_crash("after_rank_files");
    });
    const std::vector<std::string> seals =
        parallel::all_gather_strings(group, seal, "checkpoint.seals");

    // Rank 0: the index, then the rename that makes the checkpoint visible.
    on_all_ranks(group, "checkpoint.commit", [&] {
      if (rank != 0) return;
      Index index;
      for (const PlannedChunk& c : plan.chunks) {
        index.chunks.push_back({c.meta, rank_file_name(c.writer), chunk_dataset_path(c.meta.fqn)});
      }
      index.values = state.values;
      for (const std::string& text : seals) index.files.push_back(decode_seal(text));
      if (!state.per_rank_group.empty()) {
        for (size_t r = 0; r < rank_values.size(); ++r) {
          for (auto& [key, v] : decode_values(rank_values[r])) {
            index.values[per_rank_key(state.per_rank_group, int(r)) + key] = v;
          }
        }
      }
      write_index(tmp / kIndexFileName, index);
      fsync_path(tmp / kIndexFileName, false);
      fsync_path(index_checksum_path(tmp / kIndexFileName), false);
      fsync_path(tmp, true);
      maybe_crash("before_rename");
      if (fs::exists(dir)) {  // saving a step again (a run restarted from an earlier step)
        const fs::path old = fs::path(dir.string() + ".old");
        fs::remove_all(old);
        fs::rename(dir, old);
        fs::rename(tmp, dir);
        fs::remove_all(old);
      } else {
        fs::rename(tmp, dir);
      }
      fsync_path(dir.parent_path().empty() ? fs::path(".") : dir.parent_path(), true);
    });
  } catch (...) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    throw;
  }
}

LoadReport load_checkpoint(const fs::path& dir, CheckpointState& dest, ProcessGroup& group,
                           const LoadOptions& options) {
  Index index;
  LoadReport report;
  std::map<std::string, const IndexChunk*> saved;  // fqn -> its first chunk
  // A tensor is unexpected when no rank of the group wants it: ranks may hold different tensors
  // (pipeline stages), and each reports only its own missing ones.
  std::set<std::string> wanted_anywhere;
  {
    std::string mine;
    for (const TensorPiece& p : dest.tensors) mine += p.fqn + "\n";
    for (const std::string& theirs :
         parallel::all_gather_strings(group, mine, "checkpoint.load_wanted")) {
      std::istringstream lines(theirs);
      for (std::string fqn; std::getline(lines, fqn);) wanted_anywhere.insert(fqn);
    }
  }
  // Read the index and check what is wanted against it.
  on_all_ranks(group, "checkpoint.load_index", [&] {
    MT_CHECK(fs::is_directory(dir), "checkpoint ", dir.string(), ": no such folder");
    index = read_index(dir / kIndexFileName);
    for (const IndexChunk& c : index.chunks) saved.emplace(c.meta.fqn, &c);
    verify_rank_files(dir, index);  // before HDF5 opens any of them
    std::vector<std::string> problems;
    for (const TensorPiece& p : dest.tensors) {
      if (is_excluded(p.fqn, options.exclude)) continue;
      auto it = saved.find(p.fqn);
      if (it == saved.end()) {
        report.missing.push_back(p.fqn);
        continue;
      }
      const ChunkMeta& s = it->second->meta;
      const bool dtype_ok = s.dtype == p.local.dtype() ||
                            (options.convert_dtypes && runtime::is_floating(s.dtype) &&
                             runtime::is_floating(p.local.dtype()));
      if (s.global_shape != p.global_shape) {
        problems.push_back(detail::concat("tensor ", p.fqn, ": saved with shape ", s.global_shape,
                                          ", wanted ", p.global_shape));
      } else if (!dtype_ok) {
        problems.push_back(detail::concat("tensor ", p.fqn, ": saved as ",
                                          runtime::dtype_name(s.dtype), ", wanted ",
                                          runtime::dtype_name(p.local.dtype())));
      }
    }
    for (const auto& [fqn, chunk] : saved) {
      if (!wanted_anywhere.count(fqn) && !is_excluded(fqn, options.exclude))
        report.unexpected.push_back(fqn);
    }
    if (options.strict) {
      for (const std::string& m : report.missing) {
        problems.push_back("tensor " + m + ": not in the checkpoint");
      }
      for (const std::string& u : report.unexpected) {
        problems.push_back("tensor " + u + ": in the checkpoint but not in this job");
      }
    }
    if (!problems.empty()) {
      std::ostringstream msg;
      msg << "checkpoint " << dir.string() << " does not fit this job (" << problems.size()
          << " problem" << (problems.size() > 1 ? "s" : "") << "):";
      for (const std::string& p : problems) msg << "\n  " << p;
      MT_FAIL(msg.str());
    }
  });

  // Every saved chunk's checksum, verified by one rank.
  on_all_ranks(group, "checkpoint.verify", [&] {
    for (size_t i = size_t(group.rank()); i < index.chunks.size(); i += size_t(group.size())) {
      const IndexChunk& c = index.chunks[i];
      if (is_excluded(c.meta.fqn, options.exclude)) continue;
      h5::File file = open_file(dir / c.file);
      verify_checksum(file.get(), c.dataset);
    }
  });

  // The wanted regions, through the virtual datasets.
  on_all_ranks(group, "checkpoint.read", [&] {
    h5::File file = open_file(dir / kIndexFileName);
    for (TensorPiece& p : dest.tensors) {
      auto it = saved.find(p.fqn);
      if (is_excluded(p.fqn, options.exclude) || it == saved.end()) continue;
      if (p.local.numel() == 0) continue;
      const runtime::DType stored = it->second->meta.dtype;
      if (p.consume) {  // streamed: read, hand over, free
        const Tensor buffer = read_hyperslab(file.get(), tensor_view_path(p.fqn),
                                             p.global_offset, p.local.shape());
        p.consume(stored == p.local.dtype() ? buffer : buffer.to(p.local.dtype()));
        continue;
      }
      if (stored == p.local.dtype()) {
        read_hyperslab_into(file.get(), tensor_view_path(p.fqn), p.global_offset, p.local);
      } else {
        p.local.copy_(read_hyperslab(file.get(), tensor_view_path(p.fqn), p.global_offset,
                                     p.local.shape()));
      }
    }
  });

  // The values, with the per-rank ones split out.
  const std::string prefix = dest.per_rank_group.empty() ? "" : dest.per_rank_group + "/rank_";
  for (const auto& [key, v] : index.values) {
    if (prefix.empty() || !key.starts_with(prefix)) {
      report.values[key] = v;
      continue;
    }
    const std::string rest = key.substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) continue;
    const size_t r = std::stoul(rest.substr(0, slash));
    if (report.per_rank_values.size() <= r) report.per_rank_values.resize(r + 1);
    report.per_rank_values[r][rest.substr(slash + 1)] = v;
  }
  return report;
}

bool is_excluded(const std::string& fqn, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& p) { return fqn.starts_with(p); });
}

Tensor lazy_placeholder(const runtime::Shape& shape, runtime::DType dtype) {
  return runtime::zeros({}, runtime::TensorOptions{}.with_dtype(dtype)).expand(shape);
}

TensorPiece whole(std::string fqn, const Tensor& tensor) {
  return {std::move(fqn), tensor, tensor.shape(), runtime::Shape(size_t(tensor.dim()), 0)};
}

}  // namespace mt::checkpoint
