// Streaming updated embedding rows to a serving replica (mt_embedding_server): the wire format,
// the address parser and RowStreamClient, the trainer's side. The replica's side is
// row_stream_server.h; docs/embedding_streaming.md is the user's guide.
//
// Wire format (version 1). A TCP connection carries frames; every integer is little-endian, every
// float is IEEE-754 in little-endian byte order. A frame is a 16-byte header then a payload:
//   u32 magic 0x5352544D ("MTRS" as bytes) | u16 version = 1 | u16 type | u64 payload bytes
// (at most kMaxFramePayload). Strings are u16 length + UTF-8 bytes (1..kMaxNameBytes), dtype
// tags are u8: 1 = f32, 2 = f64. Frame types and payloads:
//   1 UPDATE (trainer -> replica): the new values of some rows of one table after one step.
//       str table | i64 step | i64 embedding_dim | i64 col_offset | i64 n rows | i64 cols |
//       u8 dtype | u8 n_state | n x i64 row ids (global, sorted, unique) |
//       n x cols values (row-major) |
//       n_state x { str state name | u8 dtype | i64 width | n x width values }
//     A column shard sends its columns [col_offset, col_offset + cols) of the rows:
//     0 <= col_offset, 1 <= cols, col_offset + cols <= embedding_dim.
//   2 ACK (replica -> trainer): one per UPDATE, in order, after the rows are written.
//       i64 step of the acknowledged update | i64 rows written
//   3 LOOKUP (client -> replica): str table | i64 n | n x i64 row ids
//   4 LOOKUP_REPLY (replica -> client): str table | i64 n | i64 embedding_dim | u8 dtype |
//       n x u8 found (0/1) | n x embedding_dim values (zeros where not found)
//   5 ERROR (replica -> peer): u32 length + UTF-8 message. Answers a LOOKUP of an unknown table
//       (the connection stays open) or precedes the close of a connection that sent a bad frame
//       (wrong magic or version, an unknown type, a payload over the limit, sizes that do not add
//       up): the replica never trusts a length it has not checked.
// Anything the format cannot hold (a name over kMaxNameBytes, an update whose single row exceeds
// the frame limit) is refused with an mt::Error on the sending side.
//
// RowStreamClient's behaviour (the trainer never waits for the network unless the queue is full):
// - listener() returns a RowUpdateListener that moves the updates into a queue and returns. A
//   background thread connects (TCP, connect timeout), encodes and sends the frames, and reads
//   the replica's ACKs. The queue holds every byte the replica has not yet acknowledged.
// - Queue full (over queue_limit_bytes): the listener blocks until the replica has caught up
//   enough, and logs one line saying so (again at most once a minute while it recurs). A
//   connection on which nothing moves for stall_timeout_s is treated as broken (below), so a
//   replica that stops reading cannot hold training forever.
// - Replica down (connect fails) or connection lost: the client logs one warning per outage
//   naming the address; updates not yet acknowledged, and every update made while it is down,
//   are dropped and counted (frames, rows, first and last step): the trainer keeps all its rows,
//   the replica misses those updates. It retries with exponential backoff; when it connects again
//   it logs how many updates (rows, steps) the replica missed. Since every update holds the full
//   new values of its rows, the replica is current again for every row updated after that.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/sparse/row_update.h"

namespace mt::parallel {

using runtime::DType;
using runtime::Tensor;
using runtime::TensorOptions;

// ---- wire format ---------------------------------------------------------------------------

namespace row_stream {

inline constexpr uint32_t kMagic = 0x5352544D;  // bytes "MTRS"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 16;
inline constexpr uint64_t kMaxFramePayload = uint64_t(1) << 30;  // 1 GiB, checked on receipt
inline constexpr size_t kMaxNameBytes = 4096;
// The client splits an update into frames of about this many bytes (whole rows).
inline constexpr size_t kTargetFrameBytes = size_t(16) << 20;

enum class FrameType : uint16_t { Update = 1, Ack = 2, Lookup = 3, LookupReply = 4, Error = 5 };
enum class WireDType : uint8_t { F32 = 1, F64 = 2 };

WireDType wire_dtype(DType dtype, const std::string& what);  // f32/f64, else mt::Error
DType to_dtype(WireDType dtype);
size_t wire_size(WireDType dtype);

struct FrameHeader {
  FrameType type;
  uint64_t payload_bytes = 0;
};
// Checks magic, version, type and length; throws mt::Error naming what is wrong.
FrameHeader decode_header(const std::byte* bytes);
void encode_header(std::string& out, FrameType type, uint64_t payload_bytes);

// One decoded UPDATE: values and states as raw little-endian bytes of their dtype.
struct UpdateFrame {
  std::string table;
  int64_t step = 0, embedding_dim = 0, col_offset = 0, cols = 0;
  WireDType dtype = WireDType::F32;
  std::vector<int64_t> rows;
  std::string values;  // rows.size() x cols x wire_size(dtype)
  struct State {
    std::string name;
    WireDType dtype = WireDType::F32;
    int64_t width = 0;
    std::string values;  // rows.size() x width x wire_size(dtype)
  };
  std::vector<State> state;
};

// Bytes of the UPDATE frame (header included) for rows [begin, end) of `update`.
size_t update_frame_bytes(const runtime::sparse::RowUpdate& update, int64_t begin, int64_t end,
                          bool with_state);
// Appends the UPDATE frame of rows [begin, end) of `update`; checks the update's consistency
// (sorted rows, shapes, dtypes, columns within embedding_dim).
void encode_update(std::string& out, const runtime::sparse::RowUpdate& update, int64_t begin,
                   int64_t end, bool with_state);
// Decodes an UPDATE payload; mt::Error on sizes that do not add up.
UpdateFrame decode_update(std::string_view payload);

struct LookupRequest {
  std::string table;
  std::vector<int64_t> rows;
};
void encode_lookup(std::string& out, const LookupRequest& request);
LookupRequest decode_lookup(std::string_view payload);

struct LookupResult {
  std::string table;
  std::vector<bool> found;  // per id
  Tensor values;            // [n, embedding_dim] f32 or f64, zeros where not found
};
void encode_lookup_reply(std::string& out, const LookupResult& result);
LookupResult decode_lookup_reply(std::string_view payload);

struct Ack {
  int64_t step = 0, rows = 0;
};
void encode_ack(std::string& out, const Ack& ack);
Ack decode_ack(std::string_view payload);

void encode_error(std::string& out, const std::string& message);
std::string decode_error(std::string_view payload);

}  // namespace row_stream

// ---- addresses ------------------------------------------------------------------------------

struct StreamAddress {
  std::string host;  // a host name or an IPv4 address
  int port = 0;      // 1..65535
  std::string str() const { return host + ":" + std::to_string(port); }
};

// "host:port"; mt::Error naming the text when it does not parse.
StreamAddress parse_stream_address(const std::string& text);

// ---- the trainer's side ---------------------------------------------------------------------

struct RowStreamOptions {
  int64_t queue_limit_bytes = int64_t(64) << 20;  // [embedding] stream_queue_mb
  bool send_state = false;                        // [embedding] stream_state
  // Warnings, written from the connection thread too: a stream no other thread writes unlocked
  // (a SharedLog, parallel/embedding/shared_log.h); null = silent.
  std::ostream* log = nullptr;
  double connect_timeout_s = 2.0;
  double initial_backoff_s = 0.05;  // retry delay after a failed connect, doubling ...
  double max_backoff_s = 2.0;       // ... up to this
  double stall_timeout_s = 60.0;    // a connection with unacknowledged bytes and no progress
};

struct RowStreamStats {
  int64_t frames_sent = 0;  // frames the replica acknowledged (written into its store)
  int64_t rows_sent = 0;
  int64_t bytes_sent = 0;
  int64_t frames_dropped = 0;  // frames the replica missed (down, or connection lost)
  int64_t rows_dropped = 0;
  int64_t first_dropped_step = -1, last_dropped_step = -1;  // -1: none
  int64_t queued_bytes = 0;                                 // not yet acknowledged
  int64_t queue_waits = 0;                                  // listener calls that waited for room
  double queue_wait_seconds = 0;
  int64_t connects = 0, outages = 0;
  bool connected = false;
};

// One per trainer rank (each rank streams the rows it owns; a column shard its columns):
//   RowStreamClient stream(parse_stream_address(cfg.stream_to), cfg.stream_queue_mb << 20,
//                          cfg.stream_state, &log);
//   collection.set_row_update_listener(stream.listener(), cfg.stream_state);  // outlive its use
//   ... train ...
//   stream.flush(std::chrono::seconds(10));                 // end of the run (optional)
// Thread safety: push()/the listener from one thread at a time (the training thread); stats()
// and flush() from any thread.
class RowStreamClient {
 public:
  RowStreamClient(StreamAddress address, int64_t queue_limit_bytes, bool send_state,
                  std::ostream* log);
  RowStreamClient(StreamAddress address, RowStreamOptions options);
  // Flushes for up to 2 seconds, then stops the thread (what is left is dropped).
  ~RowStreamClient();
  RowStreamClient(const RowStreamClient&) = delete;
  RowStreamClient& operator=(const RowStreamClient&) = delete;

  // Queues the updates and returns; blocks only while the queue is over its limit.
  runtime::sparse::RowUpdateListener listener();
  void push(std::vector<runtime::sparse::RowUpdate>&& updates);

  // Waits until every queued update is acknowledged or dropped, or `timeout` passes; true when
  // the queue is empty.
  bool flush(std::chrono::milliseconds timeout);
  RowStreamStats stats() const;
  const StreamAddress& address() const { return address_; }

 private:
  struct Item;
  enum class State { Connecting, Connected, Down };

  void run();
  void log_line(const std::string& line);
  void drop_locked(Item& item, bool outage = true);  // counts what the replica misses
  void enter_outage_locked(const std::string& why);
  void wake();

  StreamAddress address_;
  RowStreamOptions options_;
  mutable std::mutex mu_;
  std::condition_variable room_cv_;  // listener waits for room; flush waits for empty
  std::deque<Item> pending_;         // not yet written
  std::deque<Item> inflight_;        // written, not yet acknowledged
  State state_ = State::Connecting;
  bool stop_ = false;
  RowStreamStats stats_;
  // The current outage: what the replica misses.
  int64_t outage_frames_ = 0, outage_rows_ = 0, outage_first_step_ = -1, outage_last_step_ = -1;
  std::chrono::steady_clock::time_point last_wait_log_{};
  int64_t waits_since_log_ = 0;
  bool wait_logged_ = false;
  std::mutex log_mu_;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace mt::parallel
