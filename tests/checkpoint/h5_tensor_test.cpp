// Tests of the checkpoint storage layer: tensors as HDF5 datasets (every dtype bit-exact, 0-d and
// empty, non-contiguous inputs, sliced transfers), chunk attributes, hyperslab reads against
// tensor slices, checksum verification against a byte flipped on disk, the errors a user meets
// (each naming the file, the dataset and the tensor), and virtual datasets over rank files (a
// missing one reads as NaN / the integer minimum).
// h5py reads the files too when a Python with h5py is installed (python3-h5py); otherwise that
// test skips and says why.
#include "checkpoint/h5_tensor.h"

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checksum.h"
#include "checkpoint/h5_attributes.h"
#include "checkpoint/h5_virtual.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/hdf5_corruption.h"
#include "tests/testing/python_env.h"
#include "tests/testing/scratch_dir.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::TensorOptions;

const std::vector<DType> kAllDTypes = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                       DType::I32, DType::I64, DType::Bool};

// A tensor of random bytes (every bit pattern: NaNs, infinities and subnormals included for the
// float types); bools are 0 or 1.
Tensor pattern(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, TensorOptions{}.with_dtype(dtype));
  std::mt19937_64 rng(seed);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    p[i] = dtype == DType::Bool ? (rng() & 1) : static_cast<unsigned char>(rng());
  }
  return t;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  return std::vector<unsigned char>(p, p + c.nbytes());
}

using mt::testing::error_of;

ChunkInfo whole(const std::string& fqn, const Tensor& t) {
  return ChunkInfo{fqn, t.shape(), Shape(t.shape().size(), 0)};
}

class H5TensorTest : public ::testing::Test {
 protected:
  testing::ScratchDir dir_;
};

// ---- round trips ---------------------------------------------------------------------------

TEST_F(H5TensorTest, EveryDtypeRoundTripsBitExactWithItsAttributes) {
  const fs::path path = dir_ / "rank-0.h5";
  std::vector<Tensor> written;
  {
    h5::File file = create_file(path);
    for (size_t i = 0; i < kAllDTypes.size(); ++i) {
      Tensor t = pattern({3, 5}, kAllDTypes[i], 100 + i);
      const std::string name = "layers." + std::to_string(i) + ".w";
      write_tensor(file.get(), "/model/" + name, t, ChunkInfo{name, {7, 5}, {2, 0}});
      written.push_back(t);
    }
  }
  h5::File file = open_file(path);
  for (size_t i = 0; i < kAllDTypes.size(); ++i) {
    SCOPED_TRACE(std::string(runtime::dtype_name(kAllDTypes[i])));
    const std::string name = "layers." + std::to_string(i) + ".w";
    Tensor back = read_tensor(file.get(), "/model/" + name);
    EXPECT_EQ(back.dtype(), kAllDTypes[i]);
    EXPECT_EQ(back.shape(), Shape({3, 5}));
    EXPECT_EQ(bytes_of(back), bytes_of(written[i]));
    StoredChunk c = read_chunk_info(file.get(), "/model/" + name);
    EXPECT_EQ(c.info.fqn, name);
    EXPECT_EQ(c.info.global_shape, Shape({7, 5}));
    EXPECT_EQ(c.info.global_offset, Shape({2, 0}));
    EXPECT_EQ(c.dtype, kAllDTypes[i]);
    EXPECT_EQ(c.shape, Shape({3, 5}));
    EXPECT_EQ(c.checksum, xxh64(written[i].data_ptr(), written[i].nbytes()));
  }
}

TEST_F(H5TensorTest, DtypeAttributeNamesAndStoredTypes) {
  h5::File file = create_file(dir_ / "f.h5");
  const std::vector<std::string> names = {"float32", "float64", "bfloat16", "float16",
                                          "int32",   "int64",   "bool"};
  for (size_t i = 0; i < kAllDTypes.size(); ++i) {
    const std::string path = std::string("t").append(std::to_string(i));
    write_tensor(file.get(), path, pattern({2}, kAllDTypes[i], i), ChunkInfo{path, {2}, {0}});
    h5::Lock lock;
    h5::Dataset d(H5Dopen2(file.get(), path.c_str(), H5P_DEFAULT), "H5Dopen2", path);
    EXPECT_EQ(read_string_attr(d.get(), "dtype", path), names[i]);
    EXPECT_EQ(read_string_attr(d.get(), "checksum_algorithm", path), "xxh64");
    h5::Datatype type(H5Dget_type(d.get()), "H5Dget_type", path);
    EXPECT_EQ(H5Tget_size(type.get()), runtime::dtype_size(kAllDTypes[i]));
  }
  // bf16's layout: sign 15, exponent 7..14 with bias 127, mantissa 0..6.
  h5::Lock lock;
  h5::Dataset d(H5Dopen2(file.get(), "t2", H5P_DEFAULT), "H5Dopen2", "t2");
  h5::Datatype type(H5Dget_type(d.get()), "H5Dget_type", "t2");
  size_t spos, epos, esize, mpos, msize;
  ASSERT_GE(H5Tget_fields(type.get(), &spos, &epos, &esize, &mpos, &msize), 0);
  EXPECT_EQ(H5Tget_class(type.get()), H5T_FLOAT);
  EXPECT_EQ(std::vector<size_t>({spos, epos, esize, mpos, msize}),
            std::vector<size_t>({15, 7, 8, 0, 7}));
  EXPECT_EQ(H5Tget_ebias(type.get()), 127u);
}

TEST_F(H5TensorTest, ScalarAndEmptyTensors) {
  const fs::path path = dir_ / "f.h5";
  Tensor scalar = pattern({}, DType::F64, 1);
  Tensor empty = Tensor::empty({0, 4}, TensorOptions{}.with_dtype(DType::BF16));
  Tensor empty_3d = Tensor::empty({2, 0, 3}, TensorOptions{}.with_dtype(DType::I64));
  {
    h5::File file = create_file(path);
    write_tensor(file.get(), "scalar", scalar, ChunkInfo{"step_scale", {}, {}});
    write_tensor(file.get(), "empty", empty, ChunkInfo{"e", {6, 4}, {6, 0}});
    write_tensor(file.get(), "empty3", empty_3d, whole("e3", empty_3d));
  }
  h5::File file = open_file(path);
  Tensor s = read_tensor(file.get(), "scalar");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(bytes_of(s), bytes_of(scalar));
  StoredChunk sc = read_chunk_info(file.get(), "scalar");
  EXPECT_TRUE(sc.info.global_shape.empty());
  EXPECT_TRUE(sc.info.global_offset.empty());
  EXPECT_EQ(bytes_of(read_hyperslab(file.get(), "scalar", {}, {})), bytes_of(scalar));

  Tensor e = read_tensor(file.get(), "empty");
  EXPECT_EQ(e.shape(), Shape({0, 4}));
  EXPECT_EQ(e.dtype(), DType::BF16);
  EXPECT_EQ(read_chunk_info(file.get(), "empty").info.global_offset, Shape({6, 0}));
  EXPECT_EQ(read_chunk_info(file.get(), "empty").checksum, xxh64(nullptr, 0));
  EXPECT_EQ(read_tensor(file.get(), "empty3").shape(), Shape({2, 0, 3}));
  EXPECT_EQ(read_hyperslab(file.get(), "empty3", {1, 0, 1}, {1, 0, 2}).shape(), Shape({1, 0, 2}));
  verify_checksum(file.get(), "empty3");
}

TEST_F(H5TensorTest, NonContiguousInputIsStoredAsItsValues) {
  Tensor base = pattern({4, 6}, DType::F32, 7);
  Tensor view = base.t().narrow(0, 1, 3);  // 3 x 4, strided
  ASSERT_FALSE(view.is_contiguous());
  h5::File file = create_file(dir_ / "f.h5");
  write_tensor(file.get(), "v", view, ChunkInfo{"v", {6, 4}, {1, 0}});
  EXPECT_EQ(bytes_of(read_tensor(file.get(), "v")), bytes_of(view));
}

TEST_F(H5TensorTest, SlicedTransfersGiveTheSameBytesAndChecksum) {
  // 37 rows of 3 f64 (24 bytes): 64-byte slices move 2 rows per HDF5 call; 1-byte slices one row.
  Tensor t = pattern({37, 3}, DType::F64, 9);
  Tensor big_row = pattern({2, 1000}, DType::BF16, 10);
  h5::File file = create_file(dir_ / "f.h5");
  write_tensor(file.get(), "t", t, whole("t", t), /*slice_bytes=*/64);
  write_tensor(file.get(), "r", big_row, whole("r", big_row), /*slice_bytes=*/1);
  EXPECT_EQ(read_chunk_info(file.get(), "t").checksum, xxh64(t.data_ptr(), t.nbytes()));
  for (size_t slice : {size_t{1}, size_t{64}, size_t{100}, kIoSliceBytes}) {
    EXPECT_EQ(bytes_of(read_tensor(file.get(), "t", slice)), bytes_of(t)) << slice;
    EXPECT_EQ(bytes_of(read_tensor(file.get(), "r", slice)), bytes_of(big_row)) << slice;
    verify_checksum(file.get(), "t", slice);
  }
}

TEST_F(H5TensorTest, WritesIntoIntermediateGroups) {
  h5::File file = create_file(dir_ / "f.h5");
  Tensor t = pattern({2}, DType::I32, 3);
  write_tensor(file.get(), "/model/layers/0/attention/wq", t, whole("wq", t));
  write_tensor(file.get(), "/model/layers/0/attention/wk", t, whole("wk", t));
  EXPECT_EQ(bytes_of(read_tensor(file.get(), "model/layers/0/attention/wk")), bytes_of(t));
}

// ---- hyperslab reads -----------------------------------------------------------------------

// Reads every region of `t` given by (offset, counts) and compares it with narrow()s of t.
void expect_regions(hid_t file, const std::string& path, const Tensor& t,
                    const std::vector<std::pair<Shape, Shape>>& regions) {
  for (const auto& [offset, counts] : regions) {
    Tensor expected = t;
    for (size_t d = 0; d < offset.size(); ++d) expected = expected.narrow(d, offset[d], counts[d]);
    Tensor got = read_hyperslab(file, path, offset, counts);
    EXPECT_EQ(got.shape(), counts);
    EXPECT_EQ(bytes_of(got), bytes_of(expected))
        << path << " offset " << detail::concat(offset) << " counts " << detail::concat(counts);
  }
}

TEST_F(H5TensorTest, HyperslabsMatchSlices) {
  Tensor t1 = pattern({50}, DType::BF16, 1);
  Tensor t2 = pattern({9, 7}, DType::F32, 2);
  Tensor t3 = pattern({4, 5, 6}, DType::I64, 3);
  h5::File file = create_file(dir_ / "f.h5");
  write_tensor(file.get(), "a", t1, whole("a", t1));
  write_tensor(file.get(), "b", t2, whole("b", t2));
  write_tensor(file.get(), "c", t3, whole("c", t3));
  expect_regions(file.get(), "a", t1, {{{0}, {50}}, {{13}, {20}}, {{49}, {1}}, {{7}, {0}}});
  expect_regions(file.get(), "b", t2,
                 {{{0, 0}, {9, 7}}, {{2, 3}, {4, 2}}, {{8, 0}, {1, 7}}, {{0, 6}, {9, 1}}});
  expect_regions(file.get(), "c", t3,
                 {{{0, 0, 0}, {4, 5, 6}}, {{1, 2, 3}, {2, 3, 2}}, {{3, 4, 5}, {1, 1, 1}},
                  {{0, 1, 0}, {4, 1, 6}}});
}

TEST_F(H5TensorTest, HyperslabIntoAStridedDestination) {
  Tensor t = pattern({6, 8}, DType::F16, 4);
  h5::File file = create_file(dir_ / "f.h5");
  write_tensor(file.get(), "w", t, whole("w", t));
  Tensor big = Tensor::empty({10, 10}, TensorOptions{}.with_dtype(DType::F16));
  big.zero_();
  Tensor dest = big.narrow(0, 2, 3).narrow(1, 4, 5);  // 3 x 5 inside a 10 x 10
  read_hyperslab_into(file.get(), "w", {1, 2}, dest);
  EXPECT_EQ(bytes_of(dest), bytes_of(t.narrow(0, 1, 3).narrow(1, 2, 5)));
  EXPECT_EQ(big.narrow(0, 0, 2).to_vector<double>(), std::vector<double>(20, 0.0));
}

TEST_F(H5TensorTest, HyperslabErrorsNameTheRegion) {
  Tensor t = pattern({4, 3}, DType::F32, 5);
  h5::File file = create_file(dir_ / "f.h5");
  write_tensor(file.get(), "w", t, whole("w", t));
  std::string e = error_of([&] { read_hyperslab(file.get(), "w", {3, 0}, {2, 3}); });
  EXPECT_NE(e.find("f.h5, dataset w"), std::string::npos) << e;
  EXPECT_NE(e.find("outside the dataset's shape [4, 3] (dimension 0)"), std::string::npos) << e;
  e = error_of([&] { read_hyperslab(file.get(), "w", {0}, {2}); });
  EXPECT_NE(e.find("does not have the dataset's rank 2"), std::string::npos) << e;
  Tensor wrong = Tensor::empty({1, 1}, TensorOptions{}.with_dtype(DType::F64));
  e = error_of([&] { read_hyperslab_into(file.get(), "w", {0, 0}, wrong); });
  EXPECT_NE(e.find("holds float32, the destination is float64"), std::string::npos) << e;
}

// ---- checksums ------------------------------------------------------------------------------

TEST_F(H5TensorTest, FlippedByteIsDetectedNamingFileDatasetAndTensor) {
  const fs::path path = dir_ / "rank-3.h5";
  Tensor t = pattern({64, 16}, DType::BF16, 6);
  Tensor other = pattern({8}, DType::F32, 7);
  {
    h5::File file = create_file(path);
    write_tensor(file.get(), "/model/layers.1.ffn.w2", t, ChunkInfo{"layers.1.ffn.w2", {128, 16},
                                                                     {64, 0}});
    write_tensor(file.get(), "/model/norm", other, whole("norm.weight", other));
  }
  testing::flip_dataset_byte(path, "/model/layers.1.ffn.w2", 1000);
  h5::File file = open_file(path);
  for (size_t slice : {size_t{100}, kIoSliceBytes}) {
    const std::string e = error_of([&] { read_tensor(file.get(), "/model/layers.1.ffn.w2", slice); });
    EXPECT_NE(e.find(path.string()), std::string::npos) << e;
    EXPECT_NE(e.find("dataset /model/layers.1.ffn.w2"), std::string::npos) << e;
    EXPECT_NE(e.find("tensor layers.1.ffn.w2"), std::string::npos) << e;
    EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
    EXPECT_EQ(error_of([&] { verify_checksum(file.get(), "/model/layers.1.ffn.w2", slice); }), e);
  }
  // The other dataset is intact; a partial read does not check (and sees the flipped byte).
  verify_checksum(file.get(), "/model/norm");
  Tensor region = read_hyperslab(file.get(), "/model/layers.1.ffn.w2", {31, 0}, {1, 16});
  EXPECT_NE(bytes_of(region), bytes_of(t.narrow(0, 31, 1)));
}

// ---- errors ---------------------------------------------------------------------------------

// Creates dataset `name` with raw HDF5 (a dataset minititan did not write) and optional string
// attributes.
void raw_dataset(hid_t file, const char* name, hid_t type,
                 const std::vector<std::pair<std::string, std::string>>& attrs) {
  h5::Lock lock;
  hsize_t dims[1] = {4};
  h5::Dataspace space(H5Screate_simple(1, dims, nullptr), "H5Screate_simple", name);
  h5::Dataset d(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                "H5Dcreate2", name);
  for (const auto& [k, v] : attrs) write_string_attr(d.get(), k.c_str(), v, name);
}

TEST_F(H5TensorTest, AttributeErrorsNameFileDatasetAndAttribute) {
  const fs::path path = dir_ / "foreign.h5";
  h5::File file = create_file(path);
  raw_dataset(file.get(), "no_attrs", H5T_IEEE_F32LE, {});
  raw_dataset(file.get(), "int_says_float", H5T_STD_I32LE, {{"dtype", "float32"}});
  raw_dataset(file.get(), "bad_name", H5T_IEEE_F32LE, {{"dtype", "complex64"}});
  raw_dataset(file.get(), "no_fqn", H5T_IEEE_F32LE, {{"dtype", "float32"}});
  raw_dataset(file.get(), "fqn_is_int", H5T_IEEE_F32LE, {{"dtype", "float32"}});
  raw_dataset(file.get(), "bad_rank", H5T_IEEE_F32LE, {{"dtype", "float32"}, {"fqn", "x"}});
  {
    h5::Lock lock;
    h5::Dataset d(H5Dopen2(file.get(), "fqn_is_int", H5P_DEFAULT), "H5Dopen2", "fqn_is_int");
    write_i64s_attr(d.get(), "fqn", {1}, "fqn_is_int");
    h5::Dataset b(H5Dopen2(file.get(), "bad_rank", H5P_DEFAULT), "H5Dopen2", "bad_rank");
    write_i64s_attr(b.get(), "global_shape", {4, 4}, "bad_rank");
    write_i64s_attr(b.get(), "global_offset", {0, 0}, "bad_rank");
  }
  const std::string prefix = "checkpoint file " + path.string() + ", dataset ";
  auto expect_error = [&](const std::string& dataset, const std::string& what) {
    const std::string e = error_of([&] { read_tensor(file.get(), dataset); });
    EXPECT_NE(e.find(prefix + dataset), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  expect_error("no_attrs", "attribute 'dtype' is missing");
  expect_error("int_says_float",
               "attribute 'dtype' says float32 (4-byte float) but the data is stored as a 4-byte "
               "integer");
  expect_error("bad_name", "attribute 'dtype' is 'complex64', expected one of float32, float64, "
                           "bfloat16, float16, int32, int64, bool");
  expect_error("no_fqn", "attribute 'fqn' is missing");
  expect_error("fqn_is_int", "attribute 'fqn' should be a string, found an integer");
  expect_error("bad_rank", "(tensor x): global_shape [4, 4] and global_offset [0, 0] should have "
                           "the chunk's rank 1");
  expect_error("missing/w", "no such dataset");
  Tensor t = pattern({2}, DType::F32, 1);
  write_tensor(file.get(), "g/w", t, whole("w", t));
  expect_error("g", "is a group or a named type, not a dataset");
  // The checksum attributes are part of a chunk: a dataset without them is incomplete.
  raw_dataset(file.get(), "no_checksum", H5T_IEEE_F32LE, {{"dtype", "float32"}, {"fqn", "y"}});
  {
    h5::Lock lock;
    h5::Dataset d(H5Dopen2(file.get(), "no_checksum", H5P_DEFAULT), "H5Dopen2", "no_checksum");
    write_i64s_attr(d.get(), "global_shape", {4}, "no_checksum");
    write_i64s_attr(d.get(), "global_offset", {0}, "no_checksum");
  }
  expect_error("no_checksum", "(tensor y): attribute 'checksum_algorithm' is missing");
  // read_hyperslab needs only the dtype.
  EXPECT_EQ(read_hyperslab(file.get(), "no_checksum", {0}, {4}).shape(), Shape({4}));
}

TEST_F(H5TensorTest, WriteErrorsNameTheTensor) {
  h5::File file = create_file(dir_ / "f.h5");
  Tensor t = pattern({3, 4}, DType::F32, 1);
  write_tensor(file.get(), "w", t, whole("w", t));
  std::string e = error_of([&] { write_tensor(file.get(), "w", t, whole("w", t)); });
  EXPECT_NE(e.find("dataset w (tensor w): already exists"), std::string::npos) << e;
  e = error_of([&] { write_tensor(file.get(), "x", t, ChunkInfo{"x", {3}, {0}}); });
  EXPECT_NE(e.find("(tensor x): global_shape [3] and global_offset [0] should have the chunk's "
                   "rank 2 (chunk shape [3, 4])"),
            std::string::npos)
      << e;
  e = error_of([&] { write_tensor(file.get(), "x", t, ChunkInfo{"x", {8, 4}, {6, 0}}); });
  EXPECT_NE(e.find("a chunk of shape [3, 4] at global_offset [6, 0] does not fit in global_shape "
                   "[8, 4] (dimension 0)"),
            std::string::npos)
      << e;
  e = error_of([&] { write_tensor(file.get(), "x", t, ChunkInfo{"", {3, 4}, {0, 0}}); });
  EXPECT_NE(e.find("fqn) is empty"), std::string::npos) << e;
}

TEST_F(H5TensorTest, FileErrorsNameThePath) {
  std::string e = error_of([&] { open_file(dir_ / "absent.h5"); });
  EXPECT_NE(e.find("absent.h5: no such file"), std::string::npos) << e;
  std::ofstream(dir_ / "text.h5") << "not hdf5";
  e = error_of([&] { open_file(dir_ / "text.h5"); });
  EXPECT_NE(e.find("text.h5: cannot be opened as an HDF5 file"), std::string::npos) << e;
  e = error_of([&] { create_file(dir_ / "no" / "such" / "dir.h5"); });
  EXPECT_NE(e.find("dir.h5: cannot be created"), std::string::npos) << e;
}

// ---- virtual datasets -------------------------------------------------------------------------

// Two rank files in `dir`, each with row blocks of `t` (rows [0, split) and [split, n)), and an
// index file with the virtual dataset /tensors/w over them.
void write_split(const fs::path& dir, const Tensor& t, int64_t split) {
  const int64_t n = t.size(0);
  const Shape rest(t.shape().begin() + 1, t.shape().end());
  auto offset_of = [&](int64_t row) {
    Shape o(t.shape().size(), 0);
    o[0] = row;
    return o;
  };
  auto sizes_of = [&](int64_t rows) {
    Shape s = t.shape();
    s[0] = rows;
    return s;
  };
  {
    h5::File r0 = create_file(dir / "rank-0.h5");
    write_tensor(r0.get(), "/model/w", t.narrow(0, 0, split),
                 ChunkInfo{"w", t.shape(), offset_of(0)});
    h5::File r1 = create_file(dir / "rank-1.h5");
    write_tensor(r1.get(), "/model/w", t.narrow(0, split, n - split),
                 ChunkInfo{"w", t.shape(), offset_of(split)});
  }
  h5::File index = create_file(dir / "index.h5");
  create_virtual_dataset(index.get(), "/tensors/w", t.dtype(), t.shape(),
                         {{"rank-0.h5", "/model/w", offset_of(0), sizes_of(split)},
                          {"rank-1.h5", "/model/w", offset_of(split), sizes_of(n - split)}});
}

TEST_F(H5TensorTest, VirtualDatasetReadsTheWholeTensorAndMovesWithItsFolder) {
  Tensor t = pattern({10, 6}, DType::BF16, 11);
  write_split(dir_.path(), t, 4);
  {
    h5::File index = open_file(dir_ / "index.h5");
    EXPECT_EQ(bytes_of(read_hyperslab(index.get(), "/tensors/w", {0, 0}, {10, 6})), bytes_of(t));
    EXPECT_EQ(bytes_of(read_hyperslab(index.get(), "/tensors/w", {3, 1}, {3, 4})),
              bytes_of(t.narrow(0, 3, 3).narrow(1, 1, 4)));
  }
  // Relative source names resolve next to the index file, wherever the folder goes.
  const fs::path moved = dir_.path().string() + "_moved";
  fs::rename(dir_.path(), moved);
  {
    h5::File index = open_file(moved / "index.h5");
    EXPECT_EQ(bytes_of(read_hyperslab(index.get(), "/tensors/w", {0, 0}, {10, 6})), bytes_of(t));
  }
  fs::rename(moved, dir_.path());
}

TEST_F(H5TensorTest, VirtualDatasetOfScalarAndEmptyChunks) {
  Tensor s = pattern({}, DType::F32, 12);
  Tensor e = Tensor::empty({0, 3}, TensorOptions{}.with_dtype(DType::F32));
  Tensor t = pattern({4, 3}, DType::F32, 13);
  {
    h5::File r0 = create_file(dir_ / "rank-0.h5");
    write_tensor(r0.get(), "s", s, ChunkInfo{"s", {}, {}});
    write_tensor(r0.get(), "t", t, whole("t", t));
    h5::File r1 = create_file(dir_ / "rank-1.h5");
    write_tensor(r1.get(), "t", e, ChunkInfo{"t", {4, 3}, {4, 0}});
  }
  h5::File index = create_file(dir_ / "index.h5");
  create_virtual_dataset(index.get(), "s", DType::F32, {}, {{"rank-0.h5", "s", {}, {}}});
  create_virtual_dataset(index.get(), "t", DType::F32, {4, 3},
                         {{"rank-0.h5", "t", {0, 0}, {4, 3}}, {"rank-1.h5", "t", {4, 0}, {0, 3}}});
  EXPECT_EQ(bytes_of(read_hyperslab(index.get(), "s", {}, {})), bytes_of(s));
  EXPECT_EQ(bytes_of(read_hyperslab(index.get(), "t", {0, 0}, {4, 3})), bytes_of(t));
}

// A rank file that is gone reads as the fill value, not as zeros: NaN for the float types, the
// minimum for the integer types (FALSE for bool); the other rank's rows are still read.
TEST_F(H5TensorTest, VirtualDatasetReadsAMissingRankFileAsNanOrTheIntegerMinimum) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(runtime::dtype_name(dtype));
    const fs::path dir = dir_ / std::string(runtime::dtype_name(dtype));
    fs::create_directories(dir);
    Tensor t = pattern({5, 3}, dtype, 31);
    write_split(dir, t, 2);
    fs::remove(dir / "rank-1.h5");
    h5::File index = open_file(dir / "index.h5");
    const Tensor got = read_hyperslab(index.get(), "/tensors/w", {0, 0}, {5, 3});
    EXPECT_EQ(bytes_of(got.narrow(0, 0, 2)), bytes_of(t.narrow(0, 0, 2)));
    const Tensor missing = got.narrow(0, 2, 3).contiguous();
    for (int64_t i = 0; i < missing.numel(); ++i) {
      switch (dtype) {
        case DType::F32: EXPECT_TRUE(std::isnan(missing.data<float>()[i])) << i; break;
        case DType::F64: EXPECT_TRUE(std::isnan(missing.data<double>()[i])) << i; break;
        case DType::BF16: EXPECT_EQ(missing.data<runtime::bfloat16>()[i].bits, 0x7FC0) << i; break;
        case DType::F16: EXPECT_EQ(missing.data<runtime::float16>()[i].bits, 0x7E00) << i; break;
        case DType::I32: EXPECT_EQ(missing.data<int32_t>()[i], INT32_MIN) << i; break;
        case DType::I64: EXPECT_EQ(missing.data<int64_t>()[i], INT64_MIN) << i; break;
        case DType::Bool: EXPECT_FALSE(missing.data<bool>()[i]) << i; break;
      }
    }
  }
}

TEST_F(H5TensorTest, VirtualDatasetSourcesMustTileTheTensor) {
  h5::File index = create_file(dir_ / "index.h5");
  auto error = [&](const std::vector<VirtualSource>& sources) {
    return error_of(
        [&] { create_virtual_dataset(index.get(), "w", DType::F32, {4, 2}, sources); });
  };
  std::string e = error({{"a.h5", "w", {0, 0}, {3, 2}}, {"b.h5", "w", {2, 0}, {2, 2}}});
  EXPECT_NE(e.find("index.h5, virtual dataset w: source a.h5:w (offset [0, 0], sizes [3, 2]) "
                   "overlaps source b.h5:w"),
            std::string::npos)
      << e;
  e = error({{"a.h5", "w", {0, 0}, {3, 2}}});
  EXPECT_NE(e.find("the sources cover 6 elements of the global shape [4, 2]'s 8"),
            std::string::npos)
      << e;
  e = error({{"a.h5", "w", {2, 0}, {3, 2}}});
  EXPECT_NE(e.find("is outside the global shape [4, 2] (dimension 0)"), std::string::npos) << e;
  e = error({{"a.h5", "w", {0}, {4}}});
  EXPECT_NE(e.find("does not have the tensor's rank 2"), std::string::npos) << e;
}

// ---- h5py ---------------------------------------------------------------------------------------

TEST_F(H5TensorTest, H5pyReadsBf16AsNumbersAndVirtualDatasetsWhole) {
  const std::optional<std::string> python = testing::python_with("h5py");
  if (!python) GTEST_SKIP() << "no python3 with h5py (apt-get install python3-h5py)";
  // Values across bf16's range, both signs and zero.
  const std::vector<float> values = {1.0f, -2.5f, 0.0f, 3.140625f, 1e-20f, -65536.0f, 1.5e30f,
                                     0.0078125f};
  Tensor bf = Tensor::empty({2, 4}, TensorOptions{}.with_dtype(DType::BF16));
  for (size_t i = 0; i < values.size(); ++i) {
    bf.data<runtime::bfloat16>()[i] = runtime::bfloat16(values[i]);
  }
  Tensor t = pattern({6, 3}, DType::F32, 21);
  for (float& v : std::span(t.data<float>(), 18)) v = float(&v - t.data<float>()) * 0.5f - 3.0f;
  Tensor half = Tensor::empty({3}, TensorOptions{}.with_dtype(DType::F16));
  for (int i = 0; i < 3; ++i) half.data<runtime::float16>()[i] = runtime::float16(0.25f * i - 1.0f);
  write_split(dir_.path(), t, 2);
  {
    h5::File f = create_file(dir_ / "extra.h5");
    write_tensor(f.get(), "bf", bf, ChunkInfo{"bf", {2, 4}, {0, 0}});
    write_tensor(f.get(), "half", half, ChunkInfo{"half", {3}, {0}});
    Tensor flags = Tensor::empty({2}, TensorOptions{}.with_dtype(DType::Bool));
    flags.data<bool>()[0] = true;
    flags.data<bool>()[1] = false;
    write_tensor(f.get(), "flags", flags, ChunkInfo{"flags", {2}, {0}});
  }
  std::ostringstream values_py;
  for (float v : values) {  // the bf16 roundings (1e-20 and 1.5e30 are not exact in bf16)
    values_py << std::hexfloat << "float.fromhex('" << float(runtime::bfloat16(v)) << "'),";
  }
  const fs::path script = dir_ / "check.py";
  std::ofstream(script) << "import sys, h5py, numpy as np\n"
                        << "d = sys.argv[1]\n"
                        << "with h5py.File(d + '/extra.h5', 'r') as f:\n"
                        << "    bf = f['bf']\n"
                        << "    assert bf.attrs['dtype'] == 'bfloat16', bf.attrs['dtype']\n"
                        << "    assert bf.dtype.kind == 'f', bf.dtype\n"
                        << "    got = bf[()].astype(np.float64).ravel().tolist()\n"
                        << "    want = [" << values_py.str() << "]\n"
                        << "    assert got == want, (got, want)\n"
                        << "    h = f['half'][()]\n"
                        << "    assert h.dtype == np.float16, h.dtype\n"
                        << "    assert h.tolist() == [-1.0, -0.75, -0.5], h.tolist()\n"
                        << "    b = f['flags'][()]\n"
                        << "    assert b.dtype == np.bool_ and b.tolist() == [True, False], b\n"
                        << "    assert list(f['bf'].attrs['global_shape']) == [2, 4]\n"
                        << "with h5py.File(d + '/rank-0.h5', 'r') as a, "
                           "h5py.File(d + '/rank-1.h5', 'r') as b:\n"
                        << "    parts = np.concatenate([a['/model/w'][()], b['/model/w'][()]])\n"
                        << "with h5py.File(d + '/index.h5', 'r') as f:\n"
                        << "    w = f['/tensors/w']\n"
                        << "    assert w.is_virtual\n"
                        << "    whole = w[()]\n"
                        << "assert whole.shape == (6, 3), whole.shape\n"
                        << "assert np.array_equal(whole, parts)\n"
                        << "assert np.array_equal(whole.ravel(), np.arange(18) * 0.5 - 3.0)\n"
                        << "print('h5py ok')\n";
  // From another working directory: the virtual dataset's sources resolve next to index.h5.
  const std::string command =
      "cd / && " + *python + " '" + script.string() + "' '" + dir_.path().string() + "'";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// What docs/checkpoint.md promises h5py users: a missing rank file reads as NaN (float32, bfloat16 read
// by HDF5 as float32) or the integer minimum, and the present rank's rows are the data.
TEST_F(H5TensorTest, H5pyReadsAMissingRankFileAsNanOrTheIntegerMinimum) {
  const std::optional<std::string> python = testing::python_with("h5py");
  if (!python) GTEST_SKIP() << "no python3 with h5py (apt-get install python3-h5py)";
  for (DType dtype : {DType::F32, DType::BF16, DType::I32, DType::I64}) {
    const fs::path dir = dir_ / std::string(runtime::dtype_name(dtype));
    fs::create_directories(dir);
    Tensor t = runtime::arange(0, 12, 1, TensorOptions{}.with_dtype(dtype)).reshape({4, 3});
    write_split(dir, t, 1);
    fs::remove(dir / "rank-1.h5");
  }
  const fs::path script = dir_ / "check.py";
  std::ofstream(script) << "import sys, h5py, numpy as np\n"
                        << "for name in ['f32', 'bf16', 'i32', 'i64']:\n"
                        << "    with h5py.File(sys.argv[1] + '/' + name + '/index.h5', 'r') as f:\n"
                        << "        w = f['/tensors/w'][()]\n"
                        << "    assert w[0].tolist() == [0, 1, 2], (name, w)\n"
                        << "    if w.dtype.kind == 'f':\n"
                        << "        assert np.isnan(w[1:]).all(), (name, w)\n"
                        << "    else:\n"
                        << "        assert (w[1:] == np.iinfo(w.dtype).min).all(), (name, w)\n"
                        << "print('h5py ok')\n";
  const std::string command = *python + " '" + script.string() + "' '" + dir_.path().string() + "'";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace mt::checkpoint
