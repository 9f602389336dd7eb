// Streaming updated embedding rows to a serving replica, on loopback: the replica's rows equal the
// last values sent bitwise (f32, f64, column shards, optimizer state; in process and over TCP); a
// replica that is down never blocks training and what it missed is counted and logged; the queue
// limit blocks with one log line; a stalled replica is given up; bad frames close only their
// connection; the replica's store persists and refuses a foreign folder; address parsing; the
// mt_embedding_server tool.
#include "parallel/embedding/row_stream.h"
#include "parallel/embedding/shared_log.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <streambuf>
#include <thread>

#include "parallel/embedding/row_stream_server.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"
#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"

namespace mt::parallel {
namespace {

using runtime::sparse::RowUpdate;
using testing::error_of;
using Clock = std::chrono::steady_clock;

// An ostream that the client's thread and the test may use at once.
using SyncLog = SharedLog;

bool wait_until(const std::function<bool()>& done, double seconds = 10) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// What the replica must hold: every row's bytes as last sent, zeros in columns never sent.
struct Reference {
  struct Table {
    int64_t dim = 0;
    DType dtype = DType::F32;
    std::map<int64_t, std::vector<unsigned char>> rows;
  };
  std::map<std::string, Table> tables;
};

// An update of `rows` of `table`, columns [col_offset, col_offset + cols), random values (with
// -0.0 and a NaN payload among them: equality is bitwise), recorded into `ref`.
RowUpdate make_update(Reference& ref, const std::string& table, int64_t step, int64_t dim,
                      int64_t col_offset, int64_t cols, std::vector<int64_t> rows, DType dtype,
                      std::mt19937_64& rng) {
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  RowUpdate u;
  u.table = table;
  u.step = step;
  u.embedding_dim = dim;
  u.col_offset = col_offset;
  u.rows = rows;
  const int64_t n = int64_t(rows.size());
  u.values = Tensor::empty({n, cols}, TensorOptions{}.with_dtype(dtype));
  std::normal_distribution<double> normal;
  const size_t elem = dtype == DType::F64 ? 8 : 4;
  auto* bytes = static_cast<unsigned char*>(u.values.data_ptr());
  for (int64_t i = 0; i < n * cols; ++i) {
    double v = normal(rng);
    if (rng() % 50 == 0) v = -0.0;
    if (dtype == DType::F64) {
      u.values.data<double>()[i] = v;
    } else {
      u.values.data<float>()[i] = float(v);
      if (rng() % 60 == 0) {
        const uint32_t nan_bits = 0x7fc01234u;
        std::memcpy(bytes + i * 4, &nan_bits, 4);
      }
    }
  }
  Reference::Table& t = ref.tables[table];
  t.dim = dim;
  t.dtype = dtype;
  for (int64_t i = 0; i < n; ++i) {
    auto& row = t.rows[rows[size_t(i)]];
    row.resize(size_t(dim) * elem, 0);
    std::memcpy(row.data() + size_t(col_offset) * elem, bytes + size_t(i * cols) * elem,
                size_t(cols) * elem);
  }
  return u;
}

std::vector<int64_t> random_rows(std::mt19937_64& rng, int64_t range, int64_t count) {
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < count; ++i) rows.push_back(int64_t(rng() % uint64_t(range)));
  return rows;
}

// Checks rows 0..range-1 of every reference table in `r` (a lookup of those ids).
void expect_rows(const Reference::Table& t, const std::string& name,
                 const row_stream::LookupResult& r, int64_t range) {
  ASSERT_EQ(r.values.dtype(), t.dtype) << name;
  ASSERT_EQ(r.values.size(1), t.dim) << name;
  ASSERT_EQ(int64_t(r.found.size()), range) << name;
  const size_t width = size_t(t.dim) * r.values.element_size();
  const auto* bytes = static_cast<const unsigned char*>(r.values.data_ptr());
  int64_t checked = 0;
  for (int64_t id = 0; id < range; ++id) {
    const auto it = t.rows.find(id);
    const unsigned char* got = bytes + size_t(id) * width;
    if (it == t.rows.end()) {
      EXPECT_FALSE(r.found[size_t(id)]) << name << " row " << id << " was never sent";
      EXPECT_TRUE(std::all_of(got, got + width, [](unsigned char b) { return b == 0; }));
    } else {
      ASSERT_TRUE(r.found[size_t(id)]) << name << " row " << id;
      EXPECT_EQ(std::memcmp(got, it->second.data(), width), 0) << name << " row " << id;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << name;
}

std::vector<int64_t> iota_ids(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = i;
  return ids;
}

RowStreamServerOptions server_options(const std::filesystem::path& db, std::ostream* log,
                                      int port = 0) {
  return RowStreamServerOptions{.db = db, .port = port, .bind_host = "127.0.0.1", .log = log};
}

StreamAddress loopback(int port) { return StreamAddress{"127.0.0.1", port}; }

// A port nothing listens on (just freed by a server of our own).
int free_port(const std::filesystem::path& scratch_db) {
  RowStreamServer s(server_options(scratch_db, nullptr));
  return s.port();
}

// ---- address parsing and the codec ---------------------------------------------------------

TEST(StreamAddress, ParsesHostAndPort) {
  StreamAddress a = parse_stream_address("localhost:7070");
  EXPECT_EQ(a.host, "localhost");
  EXPECT_EQ(a.port, 7070);
  a = parse_stream_address("10.0.0.5:1");
  EXPECT_EQ(a.host, "10.0.0.5");
  EXPECT_EQ(a.port, 1);
  EXPECT_EQ(parse_stream_address("replica-2.example.org:65535").port, 65535);
  EXPECT_EQ(a.str(), "10.0.0.5:1");
}

TEST(StreamAddress, RefusesWhatDoesNotParse) {
  for (const std::string bad :
       {"localhost", ":80", "h:0", "h:99999", "h:abc", "", "h:", "h:-1", "a b:80", "h:80x"}) {
    const std::string m = error_of([&] { parse_stream_address(bad); });
    EXPECT_NE(m.find("stream address '" + bad + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("host:port"), std::string::npos) << m;
  }
  EXPECT_NE(error_of([] { parse_stream_address("h:99999"); }).find("not from 1 to 65535"),
            std::string::npos);
}

TEST(RowStreamFormat, UpdateRoundTripsAndChecksSizes) {
  Reference ref;
  std::mt19937_64 rng(1);
  RowUpdate u = make_update(ref, "t", 7, 6, 2, 3, {1, 4, 9}, DType::F64, rng);
  u.state.emplace_back("momentum1", Tensor::empty({3, 1}, TensorOptions{}));
  for (int i = 0; i < 3; ++i) u.state[0].second.data<float>()[i] = float(i) + 0.5f;
  std::string frame;
  row_stream::encode_update(frame, u, 1, 3, /*with_state=*/true);
  EXPECT_EQ(frame.size(), row_stream::update_frame_bytes(u, 1, 3, true));
  const auto h = row_stream::decode_header(reinterpret_cast<const std::byte*>(frame.data()));
  EXPECT_EQ(h.type, row_stream::FrameType::Update);
  ASSERT_EQ(h.payload_bytes + row_stream::kHeaderBytes, frame.size());
  const std::string_view payload(frame.data() + row_stream::kHeaderBytes, h.payload_bytes);
  const row_stream::UpdateFrame f = row_stream::decode_update(payload);
  EXPECT_EQ(f.table, "t");
  EXPECT_EQ(f.step, 7);
  EXPECT_EQ(f.embedding_dim, 6);
  EXPECT_EQ(f.col_offset, 2);
  EXPECT_EQ(f.cols, 3);
  EXPECT_EQ(f.rows, (std::vector<int64_t>{4, 9}));
  ASSERT_EQ(f.values.size(), 2u * 3 * 8);
  EXPECT_EQ(std::memcmp(f.values.data(), u.values.data<double>() + 3, f.values.size()), 0);
  ASSERT_EQ(f.state.size(), 1u);
  EXPECT_EQ(f.state[0].name, "momentum1");
  EXPECT_EQ(f.state[0].width, 1);
  EXPECT_EQ(std::memcmp(f.state[0].values.data(), u.state[0].second.data<float>() + 1, 8), 0);
  // Truncated and padded payloads, and a row count the payload cannot hold.
  EXPECT_NE(error_of([&] {
              row_stream::decode_update(payload.substr(0, payload.size() - 1));
            }).find("only 7 bytes left in the payload"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              row_stream::decode_update(payload.substr(0, 10));
            }).find("UPDATE frame truncated: step needs 8 bytes"),
            std::string::npos);
  std::string padded(payload);
  padded.push_back('\0');
  EXPECT_NE(error_of([&] { row_stream::decode_update(padded); }).find("do not add up"),
            std::string::npos);
  std::string huge(payload);
  const int64_t n = int64_t(1) << 40;
  std::memcpy(huge.data() + 2 + 1 + 3 * 8, &n, 8);  // the row count
  EXPECT_NE(error_of([&] { row_stream::decode_update(huge); }).find("bytes left"),
            std::string::npos);
  // Encoding refuses what the format cannot say.
  RowUpdate wide = u;
  wide.col_offset = 4;
  EXPECT_NE(error_of([&] {
              frame.clear();
              row_stream::encode_update(frame, wide, 0, 3, false);
            }).find("not within embedding_dim 6"),
            std::string::npos);
  RowUpdate unsorted = u;
  unsorted.rows = {4, 1, 9};
  EXPECT_NE(error_of([&] {
              frame.clear();
              row_stream::encode_update(frame, unsorted, 0, 3, false);
            }).find("sorted and unique"),
            std::string::npos);
}

// ---- streaming ------------------------------------------------------------------------------

TEST(RowStream, ReplicaRowsEqualTheLastValuesSentBitwise) {
  testing::ScratchDir dir;
  SyncLog server_log, client_log;
  RowStreamServer server(server_options(dir / "replica", &server_log));
  RowStreamOptions options;
  options.queue_limit_bytes = 1 << 20;
  options.send_state = true;
  options.log = &client_log;
  RowStreamClient client(loopback(server.port()), options);
  runtime::sparse::RowUpdateListener listener = client.listener();

  Reference ref, state_ref;
  std::mt19937_64 rng(42);
  constexpr int64_t kRows = 120, kSteps = 25;
  int64_t frames = 0;
  for (int64_t step = 1; step <= kSteps; ++step) {
    std::vector<RowUpdate> updates;
    updates.push_back(
        make_update(ref, "user", step, 8, 0, 8, random_rows(rng, kRows, 30), DType::F32, rng));
    // Its optimizer state (rowwise: one value per row).
    RowUpdate& user = updates.back();
    RowUpdate state =
        make_update(state_ref, "user#momentum1@0", step, 1, 0, 1, user.rows, DType::F32, rng);
    user.state.emplace_back("momentum1", state.values);
    updates.push_back(
        make_update(ref, "item", step, 5, 0, 5, random_rows(rng, kRows, 20), DType::F64, rng));
    // Two column shards of one table; sometimes only one of them changes rows.
    updates.push_back(
        make_update(ref, "cols", step, 6, 0, 4, random_rows(rng, kRows, 10), DType::F32, rng));
    if (step % 3 != 0)
      updates.push_back(
          make_update(ref, "cols", step, 6, 4, 2, random_rows(rng, kRows, 12), DType::F32, rng));
    frames += int64_t(updates.size());
    listener(std::move(updates));
  }
  ASSERT_TRUE(client.flush(std::chrono::seconds(30))) << client_log.text();
  const RowStreamStats s = client.stats();
  EXPECT_EQ(s.frames_sent, frames);
  EXPECT_EQ(s.frames_dropped, 0);
  EXPECT_EQ(s.queued_bytes, 0);
  EXPECT_TRUE(s.connected);
  EXPECT_EQ(s.connects, 1);
  EXPECT_EQ(server.stats().updates_applied, frames);
  EXPECT_EQ(server.stats().rows_applied, s.rows_sent);
  EXPECT_EQ(server.last_step("user"), kSteps);
  EXPECT_EQ(server.last_step("nope"), std::nullopt);
  EXPECT_NE(client_log.text().find("connected to the replica at 127.0.0.1:"), std::string::npos);

  for (const auto& [name, table] : ref.tables) {
    expect_rows(table, name, server.lookup(name, iota_ids(kRows)), kRows);
    expect_rows(table, name + " (TCP)",
                lookup_remote(loopback(server.port()), name, iota_ids(kRows)), kRows);
  }
  const auto& st = state_ref.tables.at("user#momentum1@0");
  expect_rows(st, "state", server.lookup("user#momentum1@0", iota_ids(kRows)), kRows);
  // A column never written reads as zeros: some "cols" rows only ever got shard 0.
  EXPECT_NE(error_of([&] { server.lookup("missing", {1}); }).find("no table 'missing'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              lookup_remote(loopback(server.port()), "missing", {1});
            }).find("no table 'missing'"),
            std::string::npos);
  EXPECT_EQ(server.stats().bad_frames, 0);
}

TEST(RowStream, ReplicaDownNeverBlocksTrainingAndCountsWhatItMisses) {
  testing::ScratchDir dir;
  const int port = free_port(dir / "probe");
  SyncLog log;
  RowStreamOptions options;
  options.queue_limit_bytes = 1 << 16;  // would block quickly if down meant "wait"
  options.log = &log;
  options.max_backoff_s = 0.1;
  RowStreamClient client(loopback(port), options);
  auto listener = client.listener();
  Reference ref;
  std::mt19937_64 rng(3);
  const auto start = Clock::now();
  for (int64_t step = 1; step <= 100; ++step)
    listener({make_update(ref, "t", step, 16, 0, 16, iota_ids(10), DType::F32, rng)});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 1.0) << "the listener must not wait for a replica that is down";
  EXPECT_TRUE(client.flush(std::chrono::seconds(5)));
  RowStreamStats s = client.stats();
  EXPECT_FALSE(s.connected);
  EXPECT_EQ(s.frames_dropped, 100);
  EXPECT_EQ(s.rows_dropped, 1000);
  EXPECT_EQ(s.first_dropped_step, 1);
  EXPECT_EQ(s.last_dropped_step, 100);
  EXPECT_EQ(s.frames_sent, 0);
  EXPECT_EQ(
      log.count("WARNING: the replica at 127.0.0.1:" + std::to_string(port) + " is unreachable"),
      1)
      << log.text();  // once per outage, not per retry or per step

  // The replica comes up on that port: later updates arrive, and the log says what it missed.
  SyncLog server_log;
  RowStreamServer server(server_options(dir / "replica", &server_log, port));
  ASSERT_TRUE(wait_until([&] { return client.stats().connected; })) << log.text();
  Reference later;
  for (int64_t step = 101; step <= 105; ++step)
    listener({make_update(later, "t", step, 16, 0, 16, random_rows(rng, 40, 8), DType::F32, rng)});
  ASSERT_TRUE(client.flush(std::chrono::seconds(10)));
  EXPECT_NE(log.text().find("connected again to the replica at 127.0.0.1:" + std::to_string(port) +
                            "; it missed 100 updates (1000 rows) of steps 1..100"),
            std::string::npos)
      << log.text();
  s = client.stats();
  EXPECT_EQ(s.frames_sent, 5);
  EXPECT_EQ(s.frames_dropped, 100);
  EXPECT_EQ(server.last_step("t"), 105);
  const auto r = server.lookup("t", iota_ids(40));
  for (int64_t id = 0; id < 40; ++id) {
    const auto it = later.tables["t"].rows.find(id);
    EXPECT_EQ(bool(r.found[size_t(id)]), it != later.tables["t"].rows.end()) << id;
    if (it != later.tables["t"].rows.end()) {
      EXPECT_EQ(std::memcmp(r.values.data<float>() + id * 16, it->second.data(), 64), 0) << id;
    }
  }

  // The replica goes away again: one more warning, training still does not wait.
  server.stop();
  ASSERT_TRUE(wait_until([&] { return !client.stats().connected; })) << log.text();
  const auto t0 = Clock::now();
  for (int64_t step = 106; step <= 150; ++step)
    listener({make_update(later, "t", step, 16, 0, 16, iota_ids(4), DType::F32, rng)});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  EXPECT_EQ(log.count("is unreachable"), 2) << log.text();
  EXPECT_EQ(client.stats().last_dropped_step, 150);
}

TEST(RowStream, FullQueueBlocksTheListenerWithOneLogLine) {
  testing::ScratchDir dir;
  SyncLog log;
  RowStreamServer server(server_options(dir / "replica", nullptr));
  RowStreamOptions options;
  options.queue_limit_bytes = 1 << 20;
  options.log = &log;
  RowStreamClient client(loopback(server.port()), options);
  auto listener = client.listener();
  Reference ref;
  std::mt19937_64 rng(5);
  // Each update is ~600 KB: the second one does not fit while the first is unacknowledged.
  const auto big = [&](int64_t step) {
    return make_update(ref, "big", step, 100, 0, 100, iota_ids(1500), DType::F32, rng);
  };
  ASSERT_TRUE(wait_until([&] { return client.stats().connected; }));
  server.set_paused(true);
  listener({big(1)});
  std::atomic<int> returned{0};
  std::thread trainer([&] {
    listener({big(2)});
    returned = 1;
    listener({big(3)});
    returned = 2;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(returned.load(), 0) << "the listener must wait while the queue is full";
  EXPECT_EQ(log.count("embedding stream: send queue over 1 MiB"), 1) << log.text();
  EXPECT_NE(log.text().find("training waits for the replica at 127.0.0.1:" +
                            std::to_string(server.port())),
            std::string::npos)
      << log.text();
  server.set_paused(false);
  trainer.join();
  EXPECT_EQ(returned.load(), 2);
  ASSERT_TRUE(client.flush(std::chrono::seconds(20)));
  const RowStreamStats s = client.stats();
  EXPECT_GE(s.queue_waits, 1);
  EXPECT_EQ(s.frames_sent, 3);
  EXPECT_EQ(s.frames_dropped, 0);
  EXPECT_EQ(log.count("send queue over"), 1) << "one line, not one per wait: " << log.text();
  expect_rows(ref.tables["big"], "big", server.lookup("big", iota_ids(1500)), 1500);
}

TEST(RowStream, StalledReplicaIsGivenUpAfterTheStallTimeout) {
  testing::ScratchDir dir;
  SyncLog log;
  RowStreamServer server(server_options(dir / "replica", nullptr));
  RowStreamOptions options;
  options.log = &log;
  options.stall_timeout_s = 0.5;
  options.max_backoff_s = 0.1;
  RowStreamClient client(loopback(server.port()), options);
  ASSERT_TRUE(wait_until([&] { return client.stats().connected; }));
  server.set_paused(true);
  Reference ref;
  std::mt19937_64 rng(9);
  client.listener()({make_update(ref, "t", 1, 4, 0, 4, iota_ids(3), DType::F32, rng)});
  ASSERT_TRUE(wait_until([&] { return log.count("no progress for 0.5 s") == 1; }, 10))
      << log.text();
  EXPECT_EQ(client.stats().frames_dropped, 1);
  server.set_paused(false);
  // The replica applies the frame it held (the client counted it as missed: a conservative
  // count), and the client reconnects and streams again.
  ASSERT_TRUE(wait_until([&] { return server.stats().updates_applied == 1; }));
  ASSERT_TRUE(wait_until([&] { return client.stats().connected; }, 10)) << log.text();
  client.listener()({make_update(ref, "t", 2, 4, 0, 4, iota_ids(3), DType::F32, rng)});
  ASSERT_TRUE(client.flush(std::chrono::seconds(10)));
  EXPECT_EQ(server.last_step("t"), 2);
}

// ---- bad frames and refused updates ---------------------------------------------------------

int raw_connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Everything the server sends until it closes the connection.
std::string read_until_closed(int fd) {
  std::string all;
  char buf[4096];
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    all.append(buf, size_t(n));
  }
  close(fd);
  return all;
}

void send_bytes(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
}

// The ERROR frame's message in what a closed connection sent.
std::string error_message(const std::string& received) {
  if (received.size() < row_stream::kHeaderBytes) return "(no frame: '" + received + "')";
  const auto h = row_stream::decode_header(reinterpret_cast<const std::byte*>(received.data()));
  if (h.type != row_stream::FrameType::Error) return "(not an ERROR frame)";
  return row_stream::decode_error(
      std::string_view(received).substr(row_stream::kHeaderBytes, h.payload_bytes));
}

TEST(RowStreamServer, BadFramesCloseTheirConnectionAndOthersAreServed) {
  testing::ScratchDir dir;
  SyncLog server_log, client_log;
  RowStreamServer server(server_options(dir / "replica", &server_log));
  RowStreamOptions options;
  options.log = &client_log;
  RowStreamClient client(loopback(server.port()), options);
  auto listener = client.listener();
  Reference ref;
  std::mt19937_64 rng(11);
  listener({make_update(ref, "t", 1, 4, 0, 4, iota_ids(5), DType::F32, rng)});
  ASSERT_TRUE(client.flush(std::chrono::seconds(10)));

  // Wrong magic.
  int fd = raw_connect(server.port());
  send_bytes(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(error_message(read_until_closed(fd)).find("bad magic"), std::string::npos);
  // Truncated: the header announces more than ever comes.
  std::string frame;
  row_stream::encode_update(frame, make_update(ref, "t", 2, 4, 0, 4, {1}, DType::F32, rng), 0, 1,
                            false);
  fd = raw_connect(server.port());
  send_bytes(fd, frame.substr(0, frame.size() - 3));
  shutdown(fd, SHUT_WR);
  EXPECT_NE(error_message(read_until_closed(fd)).find("truncated frame"), std::string::npos);
  // Sizes that do not add up: a row count far beyond the payload.
  std::string lying = frame;
  const int64_t n = int64_t(1) << 40;
  std::memcpy(lying.data() + row_stream::kHeaderBytes + 2 + 1 + 3 * 8, &n, 8);
  fd = raw_connect(server.port());
  send_bytes(fd, lying);
  EXPECT_NE(error_message(read_until_closed(fd)).find("bytes left in the payload"),
            std::string::npos);
  // A frame length over the limit, and a frame type clients do not send.
  std::string header;
  row_stream::encode_header(header, row_stream::FrameType::Update, uint64_t(1) << 40);
  fd = raw_connect(server.port());
  send_bytes(fd, header);
  EXPECT_NE(error_message(read_until_closed(fd)).find("over the limit"), std::string::npos);
  header.clear();
  row_stream::encode_ack(header, {1, 1});
  fd = raw_connect(server.port());
  send_bytes(fd, header);
  EXPECT_NE(error_message(read_until_closed(fd)).find("got type 2"), std::string::npos);

  EXPECT_EQ(server.stats().bad_frames, 5);
  EXPECT_EQ(server_log.count("bad frame from 127.0.0.1:"), 5) << server_log.text();
  EXPECT_NE(server_log.text().find("; closing the connection"), std::string::npos);
  // The good client goes on (the truncated frame of step 2 was never applied).
  Reference again;
  listener({make_update(again, "t", 3, 4, 0, 4, iota_ids(5), DType::F32, rng)});
  ASSERT_TRUE(client.flush(std::chrono::seconds(10)));
  expect_rows(again.tables["t"], "t", lookup_remote(loopback(server.port()), "t", iota_ids(5)), 5);
  EXPECT_EQ(client.stats().connects, 1) << "the good connection was never disturbed";

  // An update that does not fit the stored table is refused; the connection stays.
  Reference other;
  listener({make_update(other, "t", 4, 3, 0, 3, iota_ids(2), DType::F32, rng)});
  listener({make_update(other, "t", 5, 4, 0, 4, iota_ids(2), DType::F64, rng)});
  listener({make_update(again, "t", 6, 4, 0, 4, {7}, DType::F32, rng)});
  ASSERT_TRUE(client.flush(std::chrono::seconds(10)));
  const RowStreamStats s = client.stats();
  EXPECT_EQ(s.frames_dropped, 2);
  EXPECT_EQ(s.connects, 1);
  EXPECT_EQ(server.stats().updates_refused, 2);
  EXPECT_NE(client_log.text().find("refused the update of table 't' (step 4): table 't' is "
                                   "stored with embedding_dim 4 f32"),
            std::string::npos)
      << client_log.text();
  EXPECT_EQ(server.last_step("t"), 6);
  expect_rows(again.tables["t"], "t", server.lookup("t", iota_ids(8)), 8);
}

// ---- the store ------------------------------------------------------------------------------

TEST(RowStreamServer, StoreSurvivesARestartAndForeignFoldersAreRefused) {
  testing::ScratchDir dir;
  Reference ref;
  std::mt19937_64 rng(13);
  {
    RowStreamServer server(server_options(dir / "replica", nullptr));
    RowStreamClient client(loopback(server.port()), 1 << 20, false, nullptr);
    for (int64_t step = 1; step <= 5; ++step) {
      client.listener()(
          {make_update(ref, "a", step, 3, 0, 3, random_rows(rng, 50, 10), DType::F64, rng),
           make_update(ref, "b", step, 2, 1, 1, random_rows(rng, 50, 10), DType::F32, rng)});
    }
    ASSERT_TRUE(client.flush(std::chrono::seconds(10)));
  }
  RowStreamServer reopened(server_options(dir / "replica", nullptr));
  expect_rows(ref.tables["a"], "a", reopened.lookup("a", iota_ids(50)), 50);
  expect_rows(ref.tables["b"], "b", reopened.lookup("b", iota_ids(50)), 50);
  EXPECT_EQ(reopened.last_step("a"), 5);
  // Two replicas cannot share one store.
  EXPECT_NE(error_of([&] {
              RowStreamServer second(server_options(dir / "replica", nullptr));
            }).find(dir.path().string()),
            std::string::npos);

  std::filesystem::create_directories(dir / "notes");
  std::ofstream(dir / "notes" / "todo.txt") << "not a database\n";
  std::string m = error_of([&] { RowStreamServer s(server_options(dir / "notes", nullptr)); });
  EXPECT_NE(m.find((dir / "notes").string() + " is not a kv store"), std::string::npos) << m;
  EXPECT_TRUE(std::filesystem::exists(dir / "notes" / "todo.txt"));
  m = error_of([&] { RowStreamServer s(server_options(dir / "notes" / "todo.txt", nullptr)); });
  EXPECT_NE(m.find("is a file, not a folder"), std::string::npos) << m;
}

// ---- the tool -------------------------------------------------------------------------------

#ifdef MT_EMBEDDING_SERVER_BIN
TEST(EmbeddingServerTool, ServesLooksUpAndExplainsBadFlags) {
  const std::string bin = MT_EMBEDDING_SERVER_BIN;
  testing::CommandResult r = testing::run_command(bin + " --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--lookup HOST:PORT --table NAME --ids 1,2,3"), std::string::npos);
  r = testing::run_command(bin + " --bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown argument '--bogus'"), std::string::npos) << r.output;
  r = testing::run_command(bin + " --db /tmp/x");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--port N is required"), std::string::npos) << r.output;
  r = testing::run_command(bin + " --lookup localhost --table t --ids 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("stream address 'localhost'"), std::string::npos) << r.output;
  r = testing::run_command(bin + " --lookup 127.0.0.1:1 --table t --ids 1,x");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("'x' is not an integer row id"), std::string::npos) << r.output;

  testing::ScratchDir dir;
  RowStreamServer server(server_options(dir / "replica", nullptr));
  Reference ref;
  std::mt19937_64 rng(17);
  {
    RowStreamClient client(loopback(server.port()), 1 << 20, false, nullptr);
    client.listener()({make_update(ref, "emb", 1, 3, 0, 3, {2, 5}, DType::F32, rng)});
    ASSERT_TRUE(client.flush(std::chrono::seconds(10)));
  }
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  r = testing::run_command(bin + " --lookup " + address + " --table emb --ids 5,3,2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("table emb: 3 ids, embedding_dim 3 f32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n3: not stored\n"), std::string::npos) << r.output;
  // The printed values read back bitwise.
  for (int64_t id : {2, 5}) {
    const size_t at = r.output.find("\n" + std::to_string(id) + ":");
    ASSERT_NE(at, std::string::npos) << r.output;
    std::istringstream line(r.output.substr(at + 3));
    const auto& want = ref.tables["emb"].rows[id];
    for (int j = 0; j < 3; ++j) {
      std::string word;
      line >> word;
      const float v = std::strtof(word.c_str(), nullptr);
      EXPECT_EQ(std::memcmp(&v, want.data() + j * 4, 4), 0) << id << " col " << j << ": " << word;
    }
  }
  r = testing::run_command(bin + " --lookup " + address + " --table nope --ids 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("no table 'nope'"), std::string::npos) << r.output;

  // The server binary: serves until SIGINT, then reports and exits 0.
  r = testing::run_command("timeout --preserve-status -s INT 2 " + bin + " --db " +
                           (dir / "tool_db").string() + " --port 0 --bind 127.0.0.1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("mt_embedding_server: serving"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped (signal 2)"), std::string::npos) << r.output;
  std::filesystem::create_directories(dir / "foreign");
  std::ofstream(dir / "foreign" / "x") << "x";
  r = testing::run_command(bin + " --db " + (dir / "foreign").string() + " --port 0");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("is not a kv store"), std::string::npos) << r.output;
}
#endif

}  // namespace
}  // namespace mt::parallel
