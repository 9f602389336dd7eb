// Save planning: shared pieces get one writer (the least loaded holder), the text form round
// trips, and pieces that do not tile their tensor are errors naming it.
#include "checkpoint/save_plan.h"

#include <gtest/gtest.h>

#include "runtime/core/error.h"

namespace mt::checkpoint {
namespace {

using runtime::DType;

ChunkMeta chunk(const std::string& fqn, runtime::Shape shape, runtime::Shape offset,
                runtime::Shape sizes, DType dtype = DType::F32) {
  return {fqn, dtype, std::move(shape), std::move(offset), std::move(sizes)};
}

TEST(SavePlan, SharedPiecesAreWrittenOnceByTheLeastLoadedHolder) {
  // HSDP 2x2: ranks 0,2 hold rows [0,4) and 1,3 rows [4,8) of w; everyone holds the scalar and b.
  std::vector<std::vector<ChunkMeta>> per_rank(4);
  for (int r = 0; r < 4; ++r) {
    per_rank[size_t(r)].push_back(chunk("w", {8, 4}, {r % 2 * 4, 0}, {4, 4}));
    per_rank[size_t(r)].push_back(chunk("b", {100}, {0}, {100}));
    per_rank[size_t(r)].push_back(chunk("step", {}, {}, {}, DType::I64));
  }
  const SavePlan plan = plan_save(per_rank);
  ASSERT_EQ(plan.chunks.size(), 4u);  // b, step, w[0:4], w[4:8]
  std::vector<int64_t> bytes(4, 0);
  for (const PlannedChunk& c : plan.chunks) bytes[size_t(c.writer)] += c.meta.bytes();
  // The 400-byte b goes first to rank 0; each w shard then to the holder with fewer bytes, the
  // 8-byte step to a rank with nothing yet.
  EXPECT_EQ(bytes, (std::vector<int64_t>{400, 64, 64, 8}));
  int written = 0;
  for (const auto& w : plan.writes) written += int(w.size());
  EXPECT_EQ(written, 4);
}

TEST(SavePlan, TextFormRoundTrips) {
  const std::vector<ChunkMeta> chunks = {chunk("model.a", {3, 5}, {1, 0}, {2, 5}, DType::BF16),
                                         chunk("s", {}, {}, {}, DType::I64),
                                         chunk("empty", {0, 2}, {0, 0}, {0, 2})};
  const std::vector<ChunkMeta> back = decode_chunks(encode_chunks(chunks));
  ASSERT_EQ(back.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back[i].fqn, chunks[i].fqn);
    EXPECT_EQ(back[i].dtype, chunks[i].dtype);
    EXPECT_EQ(back[i].global_shape, chunks[i].global_shape);
    EXPECT_EQ(back[i].offset, chunks[i].offset);
    EXPECT_EQ(back[i].sizes, chunks[i].sizes);
  }
  EXPECT_THROW(encode_chunks({chunk("bad\tname", {1}, {0}, {1})}), Error);
}

std::string plan_error(const std::vector<std::vector<ChunkMeta>>& per_rank) {
  try {
    plan_save(per_rank);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SavePlan, PiecesMustTileTheirTensor) {
  EXPECT_NE(plan_error({{chunk("w", {8}, {0}, {4})}, {chunk("w", {8}, {2}, {4})}})
                .find("tensor w: pieces at offsets [2] and [0] overlap"),
            std::string::npos);
  EXPECT_NE(plan_error({{chunk("w", {8}, {0}, {4})}, {chunk("w", {8}, {4}, {3})}})
                .find("tensor w: the ranks' pieces cover 7 of its 8 elements"),
            std::string::npos);
  EXPECT_NE(plan_error({{chunk("w", {8}, {6}, {4})}}).find("lies outside its global shape [8]"),
            std::string::npos);
  EXPECT_NE(plan_error({{chunk("w", {8}, {0}, {8})}, {chunk("w", {9}, {0}, {9})}})
                .find("tensor w is f32 [8] on one rank and f32 [9] on rank 1"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::checkpoint
