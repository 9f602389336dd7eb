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
// transformers' save_pretrained does; otherwise as one model.safetensors. read_safetensors_folder
// reads either layout. Reading validates everything (header size, JSON, dtypes, shapes against
// offsets, offsets inside the file and not overlapping) with errors naming the file and tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::checkpoint {

using NamedTensors = std::map<std::string, runtime::Tensor>;

void write_safetensors(const std::filesystem::path& file, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
NamedTensors read_safetensors(const std::filesystem::path& file);

// Writes `tensors` into `folder` (created), sharded when above max_shard_bytes. Returns the
// files written.
std::vector<std::filesystem::path> write_safetensors_folder(const std::filesystem::path& folder,
                                                            const NamedTensors& tensors,
                                                            int64_t max_shard_bytes);
NamedTensors read_safetensors_folder(const std::filesystem::path& folder);

}  // namespace mt::checkpoint
