// safetensors reading and writing (see safetensors.h).
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "runtime/core/error.h"

namespace mt::checkpoint {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::Tensor;
using Json = nlohmann::json;

namespace {

constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's MAX_HEADER_SIZE

const char* st_dtype(DType d) {
  switch (d) {
    case DType::F64:
      return "F64";
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I64:
      return "I64";
    case DType::I32:
      return "I32";
    case DType::Bool:
      return "BOOL";
  }
  MT_FAIL("safetensors: unknown dtype");
}

DType from_st_dtype(const Json& s, const std::string& where) {
  MT_CHECK(s.is_string(), where, ": dtype must be a string, found ", s.dump());
  for (DType d :
       {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::Bool}) {
    if (s.get<std::string>() == st_dtype(d)) return d;
  }
  MT_FAIL(where, ": dtype ", s.get<std::string>(),
          " is not one minititan reads (F64 F32 F16 BF16 I64 I32 BOOL)");
}

// One tensor's header entry, validated on its own (the layout is checked over all of them).
struct Entry {
  std::string name;
  DType dtype;
  runtime::Shape shape;
  uint64_t begin, end;
};

Entry parse_entry(const std::string& name, const Json& entry, const std::string& where) {
  const std::string what = where + ", tensor " + name;
  MT_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
               entry.contains("data_offsets"),
           what, ": needs dtype, shape and data_offsets, found ", entry.dump());
  Entry e{name, from_st_dtype(entry["dtype"], what), {}, 0, 0};
  const Json& shape = entry["shape"];
  MT_CHECK(shape.is_array(), what, ": shape must be an array, found ", shape.dump());
  uint64_t bytes = runtime::dtype_size(e.dtype);
  for (const Json& d : shape) {
    MT_CHECK(d.is_number_unsigned(), what, ": bad shape ", shape.dump(),
             " (dimensions are non-negative integers)");
    const uint64_t n = d.get<uint64_t>();
    MT_CHECK(n <= uint64_t(INT64_MAX) && !__builtin_mul_overflow(bytes, n, &bytes), what,
             ": shape ", shape.dump(), " overflows a 64-bit byte count");
    e.shape.push_back(int64_t(n));
  }
  const Json& off = entry["data_offsets"];
  MT_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
               off[1].is_number_unsigned(),
           what, ": data_offsets must be two non-negative integers, found ", off.dump());
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  MT_CHECK(e.begin <= e.end, what, ": data_offsets [", e.begin, ", ", e.end,
           ") end before they begin");
  MT_CHECK(e.end - e.begin == bytes, what, ": data_offsets [", e.begin, ", ", e.end, ") hold ",
           e.end - e.begin, " bytes, shape ", e.shape, " ", runtime::dtype_name(e.dtype), " needs ",
           bytes);
  return e;
}

// The entries must tile [0, data_bytes) exactly, as the reference reader requires.
void check_layout(std::vector<Entry>& entries, uint64_t data_bytes, const std::string& where) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    MT_CHECK(e.end <= data_bytes, where, ", tensor ", e.name, ": data_offsets [", e.begin, ", ",
             e.end, ") lie outside the file's ", data_bytes, " data bytes (truncated?)");
    MT_CHECK(e.begin >= covered, where, ": tensors ", entries[i - 1].name, " and ", e.name,
             " overlap (bytes [", e.begin, ", ", covered, "))");
    MT_CHECK(e.begin == covered, where, ": bytes [", covered, ", ", e.begin,
             ") of the data section belong to no tensor (before ", e.name, ")");
    covered = e.end;
  }
  MT_CHECK(covered == data_bytes, where, ": ", data_bytes - covered,
           " bytes after the last tensor's data (the header accounts for ", covered, " of ",
           data_bytes, " data bytes)");
}

SafetensorsMetadata parse_metadata(const Json& j, const std::string& where) {
  MT_CHECK(j.is_object(), where, ": __metadata__ must be an object of strings, found ", j.dump());
  SafetensorsMetadata out;
  for (const auto& [key, value] : j.items()) {
    MT_CHECK(value.is_string(), where, ": __metadata__ key ", key, " must be a string, found ",
             value.dump());
    out[key] = value.get<std::string>();
  }
  return out;
}

// model-NNNNN-of-NNNNN.safetensors, N a digit.
bool is_shard_name(const std::string& name) {
  const std::string pattern = "model-#####-of-#####.safetensors";
  if (name.size() != pattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const bool digit = name[i] >= '0' && name[i] <= '9';
    if (pattern[i] == '#' ? !digit : name[i] != pattern[i]) return false;
  }
  return true;
}

// Removes what a previous export left in `folder` (save_pretrained does the same).
void remove_previous_export(const fs::path& folder) {
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name == kSingleName || name == kIndexName || is_shard_name(name)) fs::remove(entry.path());
  }
}

}  // namespace

void write_safetensors(const fs::path& file, const NamedTensors& tensors,
                       const SafetensorsMetadata& metadata) {
  Json header = Json::object();
  uint64_t offset = 0;
  std::vector<Tensor> data;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(name != "__metadata__", "safetensors ", file.string(),
             ": a tensor cannot be named __metadata__");
    Tensor c = t.to(runtime::Device::cpu()).contiguous();  // the bytes are written from the host
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
      if (c.nbytes() > 0) {
        out.write(static_cast<const char*>(c.data_ptr()), std::streamsize(c.nbytes()));
      }
    }
    out.flush();
    MT_CHECK(bool(out), "safetensors: writing ", tmp.string(), " failed (disk full?)");
  }
  fs::rename(tmp, file);
}

SafetensorsFile read_safetensors_file(const fs::path& file) {
  const std::string where = "safetensors file " + file.string();
  std::ifstream in(file, std::ios::binary);
  MT_CHECK(bool(in) && fs::is_regular_file(file), where, ": cannot be opened");
  const uint64_t size = fs::file_size(file);
  MT_CHECK(size >= 8, where, ": truncated (", size, " bytes, no room for the header length)");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  MT_CHECK(n <= kMaxHeaderBytes, where, ": header length ", n,
           " is above the 100,000,000-byte limit (not a safetensors file?)");
  MT_CHECK(n <= size - 8, where, ": header length ", n, " but only ", size - 8,
           " bytes follow it (truncated, or not a safetensors file)");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  Json header;
  try {
    header = Json::parse(text);
  } catch (const std::exception& e) {
    MT_FAIL(where, ": the header is not valid JSON: ", e.what());
  }
  MT_CHECK(header.is_object(), where, ": the header is not a JSON object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      out.metadata = parse_metadata(entry, where);
    } else {
      entries.push_back(parse_entry(name, entry, where));
    }
  }
  check_layout(entries, size - 8 - n, where);
  // Validated: every tensor lies inside the file, so the reads below are bounded by its size.
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, {e.dtype});
    if (e.end > e.begin) {
      in.seekg(std::streamoff(8 + n + e.begin));
      in.read(static_cast<char*>(t.data_ptr()), std::streamsize(e.end - e.begin));
      MT_CHECK(bool(in), where, ", tensor ", e.name, ": read failed");
    }
    out.tensors[e.name] = t;
  }
  return out;
}

NamedTensors read_safetensors(const fs::path& file) { return read_safetensors_file(file).tensors; }

std::vector<fs::path> write_safetensors_folder(const fs::path& folder, const NamedTensors& tensors,
                                               int64_t max_shard_bytes) {
  MT_CHECK(max_shard_bytes > 0, "safetensors folder ", folder.string(),
           ": max_shard_bytes must be > 0, got ", max_shard_bytes);
  fs::create_directories(folder);
  remove_previous_export(folder);
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
    written.push_back(folder / kSingleName);
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
  const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  written.push_back(folder / kIndexName);
  std::ofstream out(written.back());
  out << index.dump(2) << "\n";
  out.flush();
  MT_CHECK(bool(out), "safetensors: writing ", written.back().string(), " failed (disk full?)");
  return written;
}

NamedTensors read_safetensors_folder(const fs::path& folder) {
  const fs::path single = folder / kSingleName, index_path = folder / kIndexName;
  const std::string where = "safetensors folder " + folder.string();
  MT_CHECK(!(fs::exists(single) && fs::exists(index_path)), where, ": holds both ", kSingleName,
           " and ", kIndexName, "; remove the stale one");
  if (fs::exists(single)) return read_safetensors(single);
  MT_CHECK(fs::exists(index_path), where, ": neither ", kSingleName, " nor ", kIndexName);
  const std::string iwhere = "safetensors index " + index_path.string();
  Json index;
  try {
    index = Json::parse(std::ifstream(index_path));
  } catch (const std::exception& e) {
    MT_FAIL(iwhere, ": not valid JSON: ", e.what());
  }
  MT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
           iwhere, ": no \"weight_map\" object");
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [name, file] : index["weight_map"].items()) {
    MT_CHECK(file.is_string(), iwhere, ": weight_map maps ", name, " to ", file.dump(),
             ", not a file name");
    const std::string f = file.get<std::string>();
    MT_CHECK(!f.empty() && fs::path(f).filename() == fs::path(f) && f != "." && f != "..", iwhere,
             ": weight_map maps ", name, " to \"", f, "\", not a file in the index's folder");
    by_file[f].push_back(name);
  }
  NamedTensors out;
  for (const auto& [file, names] : by_file) {
    MT_CHECK(fs::exists(folder / file), iwhere, ": maps ", names.front(), " to ", file,
             ", which does not exist");
    NamedTensors part = read_safetensors(folder / file);
    for (const std::string& name : names) {
      auto it = part.find(name);
      MT_CHECK(it != part.end(), iwhere, ": maps ", name, " to ", file, ", which does not hold it");
      out[name] = std::move(it->second);
      part.erase(it);
    }
    MT_CHECK(part.empty(), iwhere, ": ", file, " holds ", part.begin()->first,
             ", which weight_map does not list (", part.size(), " unlisted tensor(s))");
  }
  return out;
}

}  // namespace mt::checkpoint
