// Hugging Face safetensors files: write and read named tensors.
//
// Format: 8-byte little-endian header length N, N bytes of JSON header
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"format": "pt", ...}}
// (padded with spaces to a multiple of 8), then the tensors' bytes (row-major, little-endian),
// offsets relative to the end of the header. dtypes: F64 F32 F16 BF16 I64 I32 BOOL.
//
// A model larger than `max_shard_bytes` is written as model-00001-of-0000K.safetensors ... plus
// model.safetensors.index.json ({"metadata": {"total_size": ..}, "weight_map": {name: file}}), as
// transformers' save_pretrained does; otherwise as one model.safetensors. Writing a folder first
// removes the model.safetensors / model-*-of-*.safetensors / index files a previous export left
// there (as save_pretrained does), so a folder never holds two versions of the weights.
// read_safetensors_folder reads either layout.
//
// Reading is as strict as the reference implementation (safetensors' Rust `validate`): header
// length at most 100,000,000 bytes and inside the file, a JSON object, known dtypes, shapes whose
// byte size matches data_offsets (no overflow), and offsets that tile the data section exactly
// (no overlap, no gap, no trailing bytes); `__metadata__` must map strings to strings. An index
// must name plain files in its folder that hold exactly the tensors it maps to them. Errors name
// the file and the tensor, what was expected and what was found.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::checkpoint {

using NamedTensors = std::map<std::string, runtime::Tensor>;
using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  NamedTensors tensors;
  SafetensorsMetadata metadata;  // the header's "__metadata__" (empty when absent)
};

// Writes atomically (a .tmp file renamed into place). Any tensor layout; bytes are written
// row-major. An empty `metadata` leaves "__metadata__" out.
void write_safetensors(const std::filesystem::path& file, const NamedTensors& tensors,
                       const SafetensorsMetadata& metadata = {{"format", "pt"}});
SafetensorsFile read_safetensors_file(const std::filesystem::path& file);
NamedTensors read_safetensors(const std::filesystem::path& file);  // the tensors only

// Writes `tensors` into `folder` (created), sharded when their total exceeds max_shard_bytes:
// greedily in name order, a shard closed before the tensor that would take it past the limit (a
// tensor larger than the limit gets a shard of its own). Returns the files written.
std::vector<std::filesystem::path> write_safetensors_folder(const std::filesystem::path& folder,
                                                            const NamedTensors& tensors,
                                                            int64_t max_shard_bytes);
NamedTensors read_safetensors_folder(const std::filesystem::path& folder);

}  // namespace mt::checkpoint
