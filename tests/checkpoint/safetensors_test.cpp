// safetensors files and folders: every dtype round-trips bit for bit (NaN payloads, empty and 0-D
// tensors, non-contiguous inputs), the bytes follow the reference layout, metadata comes back,
// folders shard at the limit with transformers' names and index, a rewrite leaves no stale
// weights, corrupt files and indexes are errors naming the problem, and the reference Python
// implementation (safetensors.numpy) reads our files while we read its files.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/python_env.h"
#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;
using testing::error_of;
using Json = nlohmann::json;

constexpr DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16,
                                DType::I64, DType::I32, DType::Bool};

// Random bytes (every bit pattern, NaN payloads included); bool gets 0 or 1.
Tensor random_bits(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = runtime::empty(shape, {dtype});
  std::mt19937 gen(seed);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    p[i] = static_cast<unsigned char>(dtype == DType::Bool ? gen() & 1 : gen());
  }
  return t;
}

::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    return ::testing::AssertionFailure() << mt::detail::concat(
               "shape/dtype ", a.shape(), " ", a.dtype(), " vs ", b.shape(), " ", b.dtype());
  }
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  if (ca.nbytes() > 0 && std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) != 0) {
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

void expect_same_tensors(const NamedTensors& got, const NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name << " missing";
    EXPECT_TRUE(bitwise_equal(got.at(name), t)) << name;
  }
}

std::string file_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file from a header text (padded unless told otherwise) and data bytes; header_length
// overrides the length field.
void write_raw(const fs::path& file, std::string header, const std::string& data,
               std::optional<uint64_t> header_length = std::nullopt) {
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header_length.value_or(header.size());
  std::ofstream out(file, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << data;
}

TEST(Safetensors, EveryDTypeRoundTripsBitwiseWithMetadata) {
  testing::ScratchDir scratch;
  NamedTensors tensors;
  uint32_t seed = 1;
  for (DType d : kAllDTypes) {
    const std::string n(runtime::dtype_name(d));
    tensors[n + ".matrix"] = random_bits({3, 5}, d, seed++);
    tensors[n + ".scalar"] = random_bits({}, d, seed++);
    tensors[n + ".empty"] = random_bits({2, 0, 3}, d, seed++);
    tensors[n + ".cube"] = random_bits({2, 3, 4}, d, seed++);
  }
  // A transposed view is written row-major, as its contiguous copy.
  const Tensor base = random_bits({4, 6}, DType::F32, 99);
  tensors["transposed"] = base.transpose(0, 1);
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"origin", "minititan"}, {"empty", ""}};
  write_safetensors(scratch / "all.safetensors", tensors, metadata);
  EXPECT_FALSE(fs::exists(scratch / "all.safetensors.tmp"));
  const SafetensorsFile back = read_safetensors_file(scratch / "all.safetensors");
  expect_same_tensors(back.tensors, tensors);
  EXPECT_TRUE(back.tensors.at("transposed").is_contiguous());
  EXPECT_EQ(back.metadata, metadata);

  // Without metadata: no "__metadata__" key at all, and an empty map back.
  write_safetensors(scratch / "plain.safetensors", {{"x", tensors.at("f32.matrix")}}, {});
  EXPECT_EQ(file_bytes(scratch / "plain.safetensors").find("__metadata__"), std::string::npos);
  const SafetensorsFile plain = read_safetensors_file(scratch / "plain.safetensors");
  EXPECT_TRUE(plain.metadata.empty());
  expect_same_tensors(plain.tensors, {{"x", tensors.at("f32.matrix")}});
  // The default metadata is what transformers expects.
  write_safetensors(scratch / "default.safetensors", {{"x", tensors.at("f32.matrix")}});
  EXPECT_EQ(read_safetensors_file(scratch / "default.safetensors").metadata,
            (SafetensorsMetadata{{"format", "pt"}}));
}

TEST(Safetensors, BytesFollowTheReferenceLayout) {
  testing::ScratchDir scratch;
  const Tensor a = random_bits({3}, DType::BF16, 1), b = random_bits({2, 2}, DType::I64, 2);
  const Tensor c = random_bits({5}, DType::Bool, 3);
  write_safetensors(scratch / "l.safetensors", {{"b", b}, {"a", a}, {"c", c}});
  const std::string bytes = file_bytes(scratch / "l.safetensors");
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section starts 8-byte aligned";
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.substr(header.rfind('}') + 1), std::string(n - header.rfind('}') - 1, ' '))
      << "padding is spaces";
  const Json j = Json::parse(header);
  EXPECT_EQ(j["a"]["dtype"], "BF16");
  EXPECT_EQ(j["a"]["shape"], Json({3}));
  EXPECT_EQ(j["a"]["data_offsets"], Json({0, 6}));  // name order, packed
  EXPECT_EQ(j["b"]["dtype"], "I64");
  EXPECT_EQ(j["b"]["data_offsets"], Json({6, 38}));
  EXPECT_EQ(j["c"]["dtype"], "BOOL");
  EXPECT_EQ(j["c"]["data_offsets"], Json({38, 43}));
  EXPECT_EQ(j["__metadata__"], Json({{"format", "pt"}}));
  ASSERT_EQ(bytes.size(), 8 + n + 43);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, a.data_ptr(), 6), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 6, b.data_ptr(), 32), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 38, c.data_ptr(), 5), 0);
}

TEST(Safetensors, FolderIsOneFileUpToTheLimit) {
  testing::ScratchDir scratch;
  const NamedTensors tensors = {{"a", random_bits({100}, DType::F32, 1)},
                                {"b", random_bits({100}, DType::F32, 2)}};
  const auto files = write_safetensors_folder(scratch / "m", tensors, 800);  // exactly the total
  ASSERT_EQ(files, std::vector<fs::path>{scratch / "m" / "model.safetensors"});
  EXPECT_FALSE(fs::exists(scratch / "m" / "model.safetensors.index.json"));
  expect_same_tensors(read_safetensors_folder(scratch / "m"), tensors);
}

TEST(Safetensors, FolderShardsAboveTheLimitWithAnIndex) {
  testing::ScratchDir scratch;
  // Limit 1000: [a 400, b 400] (c would pass it), [c 2000] (alone, above it), [d 600, e 400]
  // (exactly at the limit), [f 4].
  const NamedTensors tensors = {
      {"a", random_bits({100}, DType::F32, 1)},   {"b", random_bits({50}, DType::F64, 2)},
      {"c", random_bits({1000}, DType::BF16, 3)}, {"d", random_bits({75}, DType::I64, 4)},
      {"e", random_bits({100}, DType::I32, 5)},   {"f", random_bits({4}, DType::Bool, 6)}};
  const fs::path m = scratch / "m";
  const auto files = write_safetensors_folder(m, tensors, 1000);
  const std::vector<fs::path> want = {
      m / "model-00001-of-00004.safetensors", m / "model-00002-of-00004.safetensors",
      m / "model-00003-of-00004.safetensors", m / "model-00004-of-00004.safetensors",
      m / "model.safetensors.index.json"};
  ASSERT_EQ(files, want);
  EXPECT_FALSE(fs::exists(m / "model.safetensors"));
  const Json index = Json::parse(std::ifstream(m / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 400 + 400 + 2000 + 600 + 400 + 4);
  EXPECT_EQ(index["weight_map"], Json({{"a", "model-00001-of-00004.safetensors"},
                                       {"b", "model-00001-of-00004.safetensors"},
                                       {"c", "model-00002-of-00004.safetensors"},
                                       {"d", "model-00003-of-00004.safetensors"},
                                       {"e", "model-00003-of-00004.safetensors"},
                                       {"f", "model-00004-of-00004.safetensors"}}));
  EXPECT_EQ(read_safetensors(want[1]).size(), 1u);
  EXPECT_EQ(read_safetensors(want[2]).size(), 2u);
  expect_same_tensors(read_safetensors_folder(m), tensors);
}

TEST(Safetensors, RewritingAFolderLeavesNoStaleWeights) {
  testing::ScratchDir scratch;
  const fs::path m = scratch / "m";
  fs::create_directories(m);
  std::ofstream(m / "config.json") << "{}";
  std::ofstream(m / "model-1-of-2.safetensors.bak") << "x";  // not our names: kept
  std::ofstream(m / "model-0000x-of-00003.safetensors") << "x";
  const NamedTensors big = {{"a", random_bits({300}, DType::F32, 1)},
                            {"b", random_bits({300}, DType::F32, 2)},
                            {"c", random_bits({300}, DType::F32, 3)}};
  ASSERT_EQ(write_safetensors_folder(m, big, 1200).size(), 4u);  // 3 shards + index
  const NamedTensors small = {{"a", random_bits({3}, DType::F32, 4)}};
  write_safetensors_folder(m, small, 1200);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(m)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model-0000x-of-00003.safetensors",
                                             "model-1-of-2.safetensors.bak", "model.safetensors"}));
  expect_same_tensors(read_safetensors_folder(m), small);
  // And back to shards: model.safetensors goes.
  write_safetensors_folder(m, big, 1200);
  EXPECT_FALSE(fs::exists(m / "model.safetensors"));
  expect_same_tensors(read_safetensors_folder(m), big);
}

struct CorruptCase {
  const char* what;
  std::string header;
  std::string data;
  std::optional<uint64_t> header_length;
  const char* error;  // a part of the message
};

TEST(Safetensors, CorruptFilesAreErrorsNamingTheProblem) {
  testing::ScratchDir scratch;
  const std::string f32x2 = R"("dtype": "F32", "shape": [2], "data_offsets": )";
  const std::vector<CorruptCase> cases = {
      {"header length above the limit", "{}", "", uint64_t(100'000'001),
       "header length 100000001 is above the 100,000,000-byte limit"},
      {"header longer than the file", "{}", "", uint64_t(64),
       "header length 64 but only 8 bytes follow"},
      {"invalid JSON", "{\"a\": ", "", std::nullopt, "the header is not valid JSON"},
      {"not an object", "[1, 2]", "", std::nullopt, "the header is not a JSON object"},
      {"unknown dtype", R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})",
       std::string(2, '\0'), std::nullopt,
       "tensor w: dtype F8_E4M3 is not one minititan reads (F64 F32 F16 BF16 I64 I32 BOOL)"},
      {"missing field", R"({"w": {"dtype": "F32", "shape": [2]}})", "", std::nullopt,
       "tensor w: needs dtype, shape and data_offsets"},
      {"negative dimension", R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
       std::string(8, '\0'), std::nullopt, "tensor w: bad shape [-2]"},
      {"shape overflow",
       R"({"w": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
       std::string(8, '\0'), std::nullopt, "tensor w: shape [4294967296,4294967296] overflows"},
      {"size mismatch", "{\"w\": {" + f32x2 + "[0, 4]}}", std::string(4, '\0'), std::nullopt,
       "tensor w: data_offsets [0, 4) hold 4 bytes, shape [2] f32 needs 8"},
      {"reversed offsets", "{\"w\": {" + f32x2 + "[8, 0]}}", std::string(8, '\0'), std::nullopt,
       "tensor w: data_offsets [8, 0) end before they begin"},
      {"truncated data", "{\"w\": {" + f32x2 + "[0, 8]}}", std::string(5, '\0'), std::nullopt,
       "tensor w: data_offsets [0, 8) lie outside the file's 5 data bytes (truncated?)"},
      {"overlap", "{\"u\": {" + f32x2 + "[0, 8]}, \"v\": {" + f32x2 + "[4, 12]}}",
       std::string(12, '\0'), std::nullopt, "tensors u and v overlap (bytes [4, 8))"},
      {"gap", "{\"u\": {" + f32x2 + "[0, 8]}, \"v\": {" + f32x2 + "[12, 20]}}",
       std::string(20, '\0'), std::nullopt,
       "bytes [8, 12) of the data section belong to no tensor (before v)"},
      {"trailing bytes", "{\"w\": {" + f32x2 + "[0, 8]}}", std::string(11, '\0'), std::nullopt,
       "3 bytes after the last tensor's data"},
      {"metadata not strings", R"({"__metadata__": {"format": 1}})", "", std::nullopt,
       "__metadata__ key format must be a string, found 1"},
  };
  for (const CorruptCase& c : cases) {
    const fs::path file = scratch / "bad.safetensors";
    write_raw(file, c.header, c.data, c.header_length);
    const std::string message = error_of([&] { read_safetensors(file); });
    EXPECT_NE(message.find(c.error), std::string::npos)
        << c.what << ": got \"" << message << "\", want a part \"" << c.error << "\"";
    EXPECT_NE(message.find(file.string()), std::string::npos) << c.what << ": names the file";
  }
  // Shorter than the length field, and missing.
  std::ofstream(scratch / "short.safetensors") << "abc";
  EXPECT_NE(error_of([&] {
              read_safetensors(scratch / "short.safetensors");
            }).find("truncated (3 bytes, no room for the header length)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_safetensors(scratch / "none.safetensors");
            }).find("none.safetensors: cannot be opened"),
            std::string::npos);
  // A valid file cut anywhere in its header or data is refused.
  write_safetensors(scratch / "ok.safetensors", {{"w", random_bits({16}, DType::F32, 1)}});
  const std::string ok = file_bytes(scratch / "ok.safetensors");
  for (size_t cut = 0; cut < ok.size(); cut += 7) {
    std::ofstream(scratch / "cut.safetensors", std::ios::binary) << ok.substr(0, cut);
    EXPECT_FALSE(error_of([&] { read_safetensors(scratch / "cut.safetensors"); }).empty()) << cut;
  }
  // Zero-size tensors may share an offset; the reference accepts them.
  write_raw(scratch / "zero.safetensors",
            R"({"z": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}, )"
            R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
            std::string(8, '\0'));
  EXPECT_EQ(read_safetensors(scratch / "zero.safetensors").size(), 2u);
}

TEST(Safetensors, BadIndexesAreErrorsNamingTheProblem) {
  testing::ScratchDir scratch;
  const fs::path m = scratch / "m";
  const NamedTensors tensors = {{"a", random_bits({100}, DType::F32, 1)},
                                {"b", random_bits({100}, DType::F32, 2)},
                                {"c", random_bits({100}, DType::F32, 3)}};
  write_safetensors_folder(m, tensors, 800);  // [a, b], [c]
  const fs::path index = m / "model.safetensors.index.json";
  const std::string good = file_bytes(index);
  auto with_index = [&](const std::string& text) {
    std::ofstream(index) << text;
    return error_of([&] { read_safetensors_folder(m); });
  };
  const std::string s1 = "model-00001-of-00002.safetensors",
                    s2 = "model-00002-of-00002.safetensors";
  EXPECT_NE(with_index("{").find("model.safetensors.index.json: not valid JSON"),
            std::string::npos);
  EXPECT_NE(with_index(R"({"metadata": {}})").find("no \"weight_map\" object"), std::string::npos);
  EXPECT_NE(with_index(R"({"weight_map": {"a": "../x.safetensors"}})")
                .find("maps a to \"../x.safetensors\", not a file in the index's folder"),
            std::string::npos);
  EXPECT_NE(with_index(R"({"weight_map": {"a": 3}})").find("maps a to 3, not a file name"),
            std::string::npos);
  EXPECT_NE(with_index(R"({"weight_map": {"a": "gone.safetensors"}})")
                .find("maps a to gone.safetensors, which does not exist"),
            std::string::npos);
  EXPECT_NE(with_index(R"({"weight_map": {"a": ")" + s1 + R"(", "b": ")" + s1 + R"(", "c": ")" +
                       s1 + "\"}}")
                .find("maps c to " + s1 + ", which does not hold it"),
            std::string::npos);
  EXPECT_NE(with_index(R"({"weight_map": {"a": ")" + s1 + R"(", "c": ")" + s2 + "\"}}")
                .find(s1 + " holds b, which weight_map does not list"),
            std::string::npos);
  // Both layouts at once is ambiguous (which one is stale?).
  std::ofstream(index) << good;
  expect_same_tensors(read_safetensors_folder(m), tensors);
  write_safetensors(m / "model.safetensors", tensors);
  EXPECT_NE(error_of([&] {
              read_safetensors_folder(m);
            }).find("holds both model.safetensors and model.safetensors.index.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_safetensors_folder(scratch / "empty");
            }).find("neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_safetensors_folder(m, tensors, 0);
            }).find("max_shard_bytes must be > 0, got 0"),
            std::string::npos);
}

// Exactly representable values both sides compute: element i of a tensor of `dtype`.
double reference_value(DType dtype, int64_t i) {
  switch (dtype) {
    case DType::I64:
      return double((i - 3) * (int64_t(1) << 40));
    case DType::I32:
      return double((i * 7919) % 1000 - 500);
    case DType::Bool:
      return i % 3 == 0;
    default:
      return double(i - 5) * 0.375;
  }
}

Tensor reference_tensor(DType dtype, const Shape& shape) {
  const int64_t n = runtime::numel_of(shape);
  if (dtype == DType::I64 || dtype == DType::I32 || dtype == DType::Bool) {
    std::vector<int64_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = int64_t(reference_value(dtype, i));
    return runtime::from_i64(v, shape, {dtype});
  }
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = reference_value(dtype, i);
  return runtime::from_f64(v, shape, {dtype});
}

// The reference implementation: safetensors.numpy loads our file (values compared against the
// same formulas computed in numpy; BF16, which numpy lacks, through torch when present, else its
// dtype and shape through safe_open), reads our sharded folder through the index, and writes a
// file of its own that we read.
TEST(Safetensors, ReferencePythonImplementationAgrees) {
  const auto python = testing::python_with("safetensors.numpy");
  if (!python)
    GTEST_SKIP() << "no Python with safetensors and numpy (pip install safetensors numpy)";
  testing::ScratchDir scratch;
  const Shape shape = {3, 8};
  NamedTensors ours;
  for (DType d : kAllDTypes) ours[std::string(runtime::dtype_name(d))] = reference_tensor(d, shape);
  write_safetensors(scratch / "ours.safetensors", ours,
                    {{"format", "pt"}, {"origin", "minititan"}});
  write_safetensors_folder(scratch / "sharded", ours, 200);
  const std::string script = R"PY(
import json, os, sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
d = sys.argv[1]
i = np.arange(24).reshape(3, 8)
want = {
    "f64": ((i - 5) * 0.375).astype(np.float64), "f32": ((i - 5) * 0.375).astype(np.float32),
    "f16": ((i - 5) * 0.375).astype(np.float16), "i64": ((i - 3) * 2**40).astype(np.int64),
    "i32": ((i * 7919) % 1000 - 500).astype(np.int32), "bool": (i % 3 == 0),
}
def check(got, name):
    assert got.dtype == want[name].dtype, (name, got.dtype)
    assert got.shape == want[name].shape, (name, got.shape)
    assert got.tobytes() == want[name].tobytes(), (name, got, want[name])
path = os.path.join(d, "ours.safetensors")
with safe_open(path, "np") as f:
    assert sorted(f.keys()) == sorted(list(want) + ["bf16"]), f.keys()
    assert f.metadata() == {"format": "pt", "origin": "minititan"}, f.metadata()
    for name in want:
        check(f.get_tensor(name), name)
    s = f.get_slice("bf16")
    assert s.get_dtype() == "BF16" and s.get_shape() == [3, 8], (s.get_dtype(), s.get_shape())
try:
    import torch
    from safetensors.torch import load_file as load_torch
    bf16 = load_torch(path)["bf16"]
    assert torch.equal(bf16, torch.tensor((i - 5) * 0.375, dtype=torch.bfloat16)), bf16
    print("bf16 values checked with torch")
except ImportError:
    pass
index = json.load(open(os.path.join(d, "sharded", "model.safetensors.index.json")))
files = sorted(set(index["weight_map"].values()))
assert len(files) > 1, files
seen = []
for file in files:
    p = os.path.join(d, "sharded", file)
    with safe_open(p, "np") as f:
        keys = list(f.keys())
    assert all(index["weight_map"][k] == file for k in keys), (keys, file)
    seen += keys
    if "bf16" not in keys:
        for k, v in load_file(p).items():
            check(v, k)
assert sorted(seen) == sorted(index["weight_map"]), (seen, index["weight_map"])
assert index["metadata"]["total_size"] == sum(a.nbytes for a in want.values()) + 48
save_file(dict(want), os.path.join(d, "theirs.safetensors"), metadata={"writer": "python"})
print("reference safetensors ok")
)PY";
  std::ofstream(scratch / "check.py") << script;
  const testing::CommandResult r = testing::run_command(
      *python + " " + (scratch / "check.py").string() + " " + scratch.path().string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  std::cout << r.output;  // says whether bf16 values were checked (torch) or only its header
  EXPECT_NE(r.output.find("reference safetensors ok"), std::string::npos) << r.output;
  // Python orders tensors by alignment then name, with its own header: we read it all back.
  const SafetensorsFile theirs = read_safetensors_file(scratch / "theirs.safetensors");
  EXPECT_EQ(theirs.metadata, (SafetensorsMetadata{{"writer", "python"}}));
  NamedTensors want = ours;
  want.erase("bf16");
  expect_same_tensors(theirs.tensors, want);
}

}  // namespace
}  // namespace mt::checkpoint
