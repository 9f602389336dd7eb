// safetensors reading and writing (see safetensors.h).
#include "checkpoint/safetensors.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

namespace mt::checkpoint {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::Tensor;
using Json = nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // as the reference implementation

const char* st_dtype(DType d) {
  switch (d) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::Bool: return "BOOL";
  }
  MT_FAIL("safetensors: unknown dtype");
}

DType from_st_dtype(const std::string& s, const std::string& where) {
  for (DType d : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32,
                  DType::Bool}) {
    if (s == st_dtype(d)) return d;
  }
  MT_FAIL(where, ": dtype ", s, " is not one minititan reads (F64 F32 F16 BF16 I64 I32 BOOL)");
}

}  // namespace

void write_safetensors(const fs::path& file, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  uint64_t offset = 0;
  std::vector<Tensor> data;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(name != "__metadata__", "safetensors: a tensor cannot be named __metadata__");
    Tensor c = t.contiguous();
    const uint64_t bytes = c.nbytes();
    header[name] = {{"dtype", st_dtype(c.dtype())},
                    {"shape", c.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(c);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const fs::path tmp = fs::path(file.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MT_CHECK(bool(out), "safetensors: cannot create ", tmp.string());
    const uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const Tensor& c : data) {
      if (c.nbytes() > 0) out.write(static_cast<const char*>(c.data_ptr()), std::streamsize(c.nbytes()));
    }
    MT_CHECK(bool(out), "safetensors: writing ", tmp.string(), " failed (disk full?)");
  }
  fs::rename(tmp, file);
}

NamedTensors read_safetensors(const fs::path& file) {
  const std::string where = "safetensors file " + file.string();
  std::ifstream in(file, std::ios::binary);
  MT_CHECK(bool(in), where, ": cannot be opened");
  const uint64_t size = fs::file_size(file);
  MT_CHECK(size >= 8, where, ": truncated (", size, " bytes, no header length)");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  MT_CHECK(n <= kMaxHeaderBytes && n <= size - 8, where, ": header length ", n,
           " is larger than the file or the 100 MiB limit (not a safetensors file?)");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  Json header;
  try {
    header = Json::parse(text);
  } catch (const std::exception& e) {
    MT_FAIL(where, ": the header is not valid JSON: ", e.what());
  }
  MT_CHECK(header.is_object(), where, ": the header is not a JSON object");
  const uint64_t data_bytes = size - 8 - n;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  NamedTensors out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string what = where + ", tensor " + name;
    MT_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                 entry.contains("data_offsets"),
             what, ": needs dtype, shape and data_offsets");
    const DType dtype = from_st_dtype(entry["dtype"].get<std::string>(), what);
    runtime::Shape shape;
    for (const Json& d : entry["shape"]) {
      MT_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, what, ": bad shape ",
               entry["shape"].dump());
      shape.push_back(d.get<int64_t>());
    }
    const Json& off = entry["data_offsets"];
    MT_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                 off[1].is_number_unsigned(),
             what, ": data_offsets must be two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    const uint64_t want = uint64_t(runtime::numel_of(shape)) * runtime::dtype_size(dtype);
    MT_CHECK(begin <= end && end <= data_bytes, what, ": data_offsets [", begin, ", ", end,
             ") lie outside the file's ", data_bytes, " data bytes (truncated?)");
    MT_CHECK(end - begin == want, what, ": data_offsets hold ", end - begin, " bytes, shape ",
             shape, " ", runtime::dtype_name(dtype), " needs ", want);
    spans.push_back({begin, end, name});
    Tensor t = Tensor::empty(shape, {dtype});
    if (want > 0) {
      in.seekg(std::streamoff(8 + n + begin));
      in.read(static_cast<char*>(t.data_ptr()), std::streamsize(want));
      MT_CHECK(bool(in), what, ": read failed");
    }
    out[name] = t;
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    MT_CHECK(spans[i].begin >= spans[i - 1].end, where, ": tensors ", spans[i - 1].name, " and ",
             spans[i].name, " overlap");
  }
  return out;
}

std::vector<fs::path> write_safetensors_folder(const fs::path& folder, const NamedTensors& tensors,
                                               int64_t max_shard_bytes) {
  MT_CHECK(max_shard_bytes > 0, "safetensors: max_shard_bytes must be > 0");
  fs::create_directories(folder);
  // Greedy shards in name order, each at most max_shard_bytes (a bigger tensor gets its own).
  std::vector<NamedTensors> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = int64_t(t.nbytes());
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back()[name] = t;
    in_shard += bytes;
    total += bytes;
  }
  std::vector<fs::path> written;
  if (shards.size() == 1) {
    written.push_back(folder / "model.safetensors");
    write_safetensors(written.back(), shards[0]);
    return written;
  }
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    written.push_back(folder / name);
    write_safetensors(written.back(), shards[i]);
    for (const auto& [tensor, t] : shards[i]) weight_map[tensor] = name;
  }
  Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream(folder / kIndexName) << index.dump(2) << "\n";
  written.push_back(folder / kIndexName);
  return written;
}

NamedTensors read_safetensors_folder(const fs::path& folder) {
  if (fs::exists(folder / "model.safetensors")) return read_safetensors(folder / "model.safetensors");
  const fs::path index_path = folder / kIndexName;
  MT_CHECK(fs::exists(index_path), "safetensors folder ", folder.string(),
           ": neither model.safetensors nor ", kIndexName);
  Json index;
  try {
    index = Json::parse(std::ifstream(index_path));
  } catch (const std::exception& e) {
    MT_FAIL(index_path.string(), ": not valid JSON: ", e.what());
  }
  MT_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), index_path.string(),
           ": no weight_map");
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [name, file] : index["weight_map"].items()) {
    by_file[file.get<std::string>()].push_back(name);
  }
  NamedTensors out;
  for (const auto& [file, names] : by_file) {
    NamedTensors part = read_safetensors(folder / file);
    for (const std::string& name : names) {
      auto it = part.find(name);
      MT_CHECK(it != part.end(), index_path.string(), ": maps ", name, " to ", file,
               ", which does not hold it");
      out[name] = it->second;
    }
  }
  return out;
}

}  // namespace mt::checkpoint
