#include "parallel/embedding/row_stream.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>

#include "parallel/embedding/row_stream_socket.h"
#include "runtime/core/error.h"

namespace mt::parallel {

static_assert(std::endian::native == std::endian::little,
              "row stream: the wire format is little-endian; this host needs byte swaps");

namespace row_stream {

namespace {

// ---- byte writer and checked reader --------------------------------------------------------

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void put_str(std::string& out, const std::string& s, const char* what) {
  MT_CHECK(!s.empty() && s.size() <= kMaxNameBytes, "row stream: ", what, " '", s,
           "' must have 1 to ", kMaxNameBytes, " bytes");
  put<uint16_t>(out, uint16_t(s.size()));
  out.append(s);
}

class Reader {
 public:
  Reader(std::string_view bytes, const char* frame) : bytes_(bytes), frame_(frame) {}

  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    const uint16_t n = get<uint16_t>(what);
    MT_CHECK(n >= 1 && n <= kMaxNameBytes, "row stream: ", frame_, " frame: ", what, " has length ",
             n, " (expected 1 to ", kMaxNameBytes, ")");
    return std::string(take(n, what));
  }
  // `count` items of `item_bytes`, with the product checked against what is left.
  std::string_view array(int64_t count, size_t item_bytes, const char* what) {
    MT_CHECK(count >= 0, "row stream: ", frame_, " frame: negative count ", count, " of ", what);
    MT_CHECK(item_bytes == 0 || uint64_t(count) <= left() / item_bytes, "row stream: ", frame_,
             " frame: ", count, " x ", item_bytes, " bytes of ", what, " but only ", left(),
             " bytes left in the payload");
    return take(size_t(count) * item_bytes, what);
  }
  std::string_view take(size_t n, const char* what) {
    need(n, what);
    std::string_view v = bytes_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  size_t left() const { return bytes_.size() - pos_; }
  void done() const {
    MT_CHECK(left() == 0, "row stream: ", frame_, " frame: ", left(),
             " bytes after the last field (sizes do not add up)");
  }

 private:
  void need(size_t n, const char* what) const {
    MT_CHECK(n <= left(), "row stream: ", frame_, " frame truncated: ", what, " needs ", n,
             " bytes, ", left(), " left");
  }
  std::string_view bytes_;
  const char* frame_;
  size_t pos_ = 0;
};

WireDType read_dtype(Reader& r, const char* frame, const char* what) {
  const uint8_t tag = r.get<uint8_t>(what);
  MT_CHECK(tag == uint8_t(WireDType::F32) || tag == uint8_t(WireDType::F64), "row stream: ", frame,
           " frame: ", what, " tag ", int(tag), " (expected 1 = f32 or 2 = f64)");
  return WireDType(tag);
}

// Column count of a value or state tensor ([n] counts as one column).
int64_t columns_of(const Tensor& t) { return t.dim() == 1 ? 1 : t.size(1); }

void check_block(const Tensor& t, size_t n, const std::string& what) {
  MT_CHECK(t.defined(), "row stream: ", what, " is not set");
  MT_CHECK(t.device().is_cpu(), "row stream: ", what, " must be a host tensor, is on ", t.device());
  MT_CHECK((t.dim() == 2 || t.dim() == 1) && t.size(0) == int64_t(n), "row stream: ", what,
           " has shape ", t.shape(), ", expected [", n, ", width]");
  wire_dtype(t.dtype(), what);
}

// Appends rows [begin, end) of the 2-D (or 1-D) tensor `t`.
void put_rows(std::string& out, const Tensor& t, int64_t begin, int64_t end) {
  const Tensor c = t.is_contiguous() ? t : t.contiguous();
  const size_t row_bytes = size_t(columns_of(c)) * c.element_size();
  const char* base = static_cast<const char*>(c.data_ptr());
  out.append(base + size_t(begin) * row_bytes, size_t(end - begin) * row_bytes);
}

}  // namespace

WireDType wire_dtype(DType dtype, const std::string& what) {
  if (dtype == DType::F32) return WireDType::F32;
  if (dtype == DType::F64) return WireDType::F64;
  MT_FAIL("row stream: ", what, " is ", dtype_name(dtype), "; the stream carries f32 or f64");
}

DType to_dtype(WireDType dtype) { return dtype == WireDType::F64 ? DType::F64 : DType::F32; }
size_t wire_size(WireDType dtype) { return dtype == WireDType::F64 ? 8 : 4; }

FrameHeader decode_header(const std::byte* bytes) {
  uint32_t magic;
  uint16_t version, type;
  uint64_t length;
  std::memcpy(&magic, bytes, 4);
  std::memcpy(&version, bytes + 4, 2);
  std::memcpy(&type, bytes + 6, 2);
  std::memcpy(&length, bytes + 8, 8);
  MT_CHECK(magic == kMagic, "row stream: bad magic 0x", std::hex, magic, std::dec,
           " (expected \"MTRS\"): the peer does not speak the row stream protocol");
  MT_CHECK(version == kVersion, "row stream: protocol version ", version, ", expected ", kVersion);
  MT_CHECK(type >= uint16_t(FrameType::Update) && type <= uint16_t(FrameType::Error),
           "row stream: unknown frame type ", type);
  MT_CHECK(length <= kMaxFramePayload, "row stream: frame payload of ", length,
           " bytes is over the limit of ", kMaxFramePayload);
  return {FrameType(type), length};
}

void encode_header(std::string& out, FrameType type, uint64_t payload_bytes) {
  put<uint32_t>(out, kMagic);
  put<uint16_t>(out, kVersion);
  put<uint16_t>(out, uint16_t(type));
  put<uint64_t>(out, payload_bytes);
}

namespace {

void check_update(const runtime::sparse::RowUpdate& u, bool with_state) {
  const std::string name =
      "update of table '" + u.table + "' (step " + std::to_string(u.step) + ")";
  MT_CHECK(!u.table.empty() && u.table.size() <= kMaxNameBytes, "row stream: table name '", u.table,
           "' must have 1 to ", kMaxNameBytes, " bytes");
  check_block(u.values, u.rows.size(), name + " values");
  const int64_t cols = columns_of(u.values);
  MT_CHECK(cols >= 1 && u.col_offset >= 0 && u.embedding_dim >= 1 &&
               u.col_offset <= u.embedding_dim - cols,
           "row stream: ", name, ": columns [", u.col_offset, ", ", u.col_offset + cols,
           ") are not within embedding_dim ", u.embedding_dim);
  for (size_t i = 1; i < u.rows.size(); ++i)
    MT_CHECK(u.rows[i - 1] < u.rows[i], "row stream: ", name,
             ": row ids must be sorted and unique, got ", u.rows[i - 1], " then ", u.rows[i]);
  if (!with_state) return;
  MT_CHECK(u.state.size() <= 255, "row stream: ", name, ": ", u.state.size(),
           " state tensors (at most 255)");
  for (const auto& [state_name, t] : u.state) {
    MT_CHECK(!state_name.empty() && state_name.size() <= kMaxNameBytes, "row stream: ", name,
             ": state name '", state_name, "' must have 1 to ", kMaxNameBytes, " bytes");
    check_block(t, u.rows.size(), name + " state '" + state_name + "'");
  }
}

}  // namespace

size_t update_frame_bytes(const runtime::sparse::RowUpdate& u, int64_t begin, int64_t end,
                          bool with_state) {
  const size_t n = size_t(end - begin);
  size_t bytes = kHeaderBytes + 2 + u.table.size() + 5 * 8 + 2 + n * 8 +
                 n * size_t(columns_of(u.values)) * u.values.element_size();
  if (with_state)
    for (const auto& [name, t] : u.state)
      bytes += 2 + name.size() + 1 + 8 + n * size_t(columns_of(t)) * t.element_size();
  return bytes;
}

void encode_update(std::string& out, const runtime::sparse::RowUpdate& u, int64_t begin,
                   int64_t end, bool with_state) {
  check_update(u, with_state);
  MT_CHECK(0 <= begin && begin <= end && end <= int64_t(u.rows.size()), "row stream: rows [", begin,
           ", ", end, ") of an update of ", u.rows.size(), " rows");
  const size_t start = out.size();
  const size_t total = update_frame_bytes(u, begin, end, with_state);
  out.reserve(start + total);
  encode_header(out, FrameType::Update, total - kHeaderBytes);
  put_str(out, u.table, "table name");
  put<int64_t>(out, u.step);
  put<int64_t>(out, u.embedding_dim);
  put<int64_t>(out, u.col_offset);
  put<int64_t>(out, end - begin);
  put<int64_t>(out, columns_of(u.values));
  put<uint8_t>(out, uint8_t(wire_dtype(u.values.dtype(), "values")));
  put<uint8_t>(out, with_state ? uint8_t(u.state.size()) : uint8_t(0));
  out.append(reinterpret_cast<const char*>(u.rows.data() + begin), size_t(end - begin) * 8);
  put_rows(out, u.values, begin, end);
  if (with_state) {
    for (const auto& [name, t] : u.state) {
      put_str(out, name, "state name");
      put<uint8_t>(out, uint8_t(wire_dtype(t.dtype(), "state")));
      put<int64_t>(out, columns_of(t));
      put_rows(out, t, begin, end);
    }
  }
  MT_CHECK(out.size() - start == total, "row stream: internal error: encoded ", out.size() - start,
           " bytes, expected ", total);
}

UpdateFrame decode_update(std::string_view payload) {
  Reader r(payload, "UPDATE");
  UpdateFrame f;
  f.table = r.str("table name");
  f.step = r.get<int64_t>("step");
  f.embedding_dim = r.get<int64_t>("embedding_dim");
  f.col_offset = r.get<int64_t>("col_offset");
  const int64_t n = r.get<int64_t>("row count");
  f.cols = r.get<int64_t>("cols");
  f.dtype = read_dtype(r, "UPDATE", "values dtype");
  const uint8_t n_state = r.get<uint8_t>("state count");
  MT_CHECK(f.embedding_dim >= 1 && f.cols >= 1 && f.col_offset >= 0 &&
               f.col_offset <= f.embedding_dim - f.cols,
           "row stream: UPDATE frame of table '", f.table, "': columns [", f.col_offset, ", +",
           f.cols, ") are not within embedding_dim ", f.embedding_dim);
  MT_CHECK(uint64_t(f.cols) <= kMaxFramePayload, "row stream: UPDATE frame: ", f.cols,
           " columns is over the limit");
  const std::string_view ids = r.array(n, 8, "row ids");
  f.rows.resize(size_t(n));
  if (n > 0) std::memcpy(f.rows.data(), ids.data(), ids.size());
  for (size_t i = 1; i < f.rows.size(); ++i)
    MT_CHECK(f.rows[i - 1] < f.rows[i], "row stream: UPDATE frame of table '", f.table,
             "': row ids not sorted and unique (", f.rows[i - 1], " then ", f.rows[i], ")");
  f.values = std::string(r.array(n, size_t(f.cols) * wire_size(f.dtype), "values"));
  for (uint8_t s = 0; s < n_state; ++s) {
    UpdateFrame::State st;
    st.name = r.str("state name");
    st.dtype = read_dtype(r, "UPDATE", "state dtype");
    st.width = r.get<int64_t>("state width");
    MT_CHECK(st.width >= 1 && uint64_t(st.width) <= kMaxFramePayload,
             "row stream: UPDATE frame: state '", st.name, "' width ", st.width);
    st.values = std::string(r.array(n, size_t(st.width) * wire_size(st.dtype), "state values"));
    f.state.push_back(std::move(st));
  }
  r.done();
  return f;
}

void encode_lookup(std::string& out, const LookupRequest& request) {
  encode_header(out, FrameType::Lookup, 2 + request.table.size() + 8 + request.rows.size() * 8);
  put_str(out, request.table, "table name");
  put<int64_t>(out, int64_t(request.rows.size()));
  out.append(reinterpret_cast<const char*>(request.rows.data()), request.rows.size() * 8);
}

LookupRequest decode_lookup(std::string_view payload) {
  Reader r(payload, "LOOKUP");
  LookupRequest q;
  q.table = r.str("table name");
  const int64_t n = r.get<int64_t>("id count");
  const std::string_view ids = r.array(n, 8, "row ids");
  q.rows.resize(size_t(n));
  if (n > 0) std::memcpy(q.rows.data(), ids.data(), ids.size());
  r.done();
  return q;
}

void encode_lookup_reply(std::string& out, const LookupResult& result) {
  const size_t n = result.found.size();
  const int64_t dim = result.values.size(1);
  const size_t value_bytes = n * size_t(dim) * result.values.element_size();
  encode_header(out, FrameType::LookupReply, 2 + result.table.size() + 8 + 8 + 1 + n + value_bytes);
  put_str(out, result.table, "table name");
  put<int64_t>(out, int64_t(n));
  put<int64_t>(out, dim);
  put<uint8_t>(out, uint8_t(wire_dtype(result.values.dtype(), "lookup values")));
  for (bool f : result.found) put<uint8_t>(out, f ? 1 : 0);
  if (n > 0) put_rows(out, result.values, 0, int64_t(n));
}

LookupResult decode_lookup_reply(std::string_view payload) {
  Reader r(payload, "LOOKUP_REPLY");
  LookupResult res;
  res.table = r.str("table name");
  const int64_t n = r.get<int64_t>("id count");
  const int64_t dim = r.get<int64_t>("embedding_dim");
  MT_CHECK(dim >= 1 && uint64_t(dim) <= kMaxFramePayload,
           "row stream: LOOKUP_REPLY frame: ", "embedding_dim ", dim);
  const WireDType dtype = read_dtype(r, "LOOKUP_REPLY", "values dtype");
  const std::string_view flags = r.array(n, 1, "found flags");
  res.found.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) res.found[size_t(i)] = flags[size_t(i)] != 0;
  const std::string_view values = r.array(n, size_t(dim) * wire_size(dtype), "values");
  res.values = Tensor::empty({n, dim}, TensorOptions{}.with_dtype(to_dtype(dtype)));
  if (!values.empty()) std::memcpy(res.values.data_ptr(), values.data(), values.size());
  r.done();
  return res;
}

void encode_ack(std::string& out, const Ack& ack) {
  encode_header(out, FrameType::Ack, 16);
  put<int64_t>(out, ack.step);
  put<int64_t>(out, ack.rows);
}

Ack decode_ack(std::string_view payload) {
  Reader r(payload, "ACK");
  Ack a;
  a.step = r.get<int64_t>("step");
  a.rows = r.get<int64_t>("rows");
  r.done();
  return a;
}

void encode_error(std::string& out, const std::string& message) {
  const std::string m = message.substr(0, 1 << 16);
  encode_header(out, FrameType::Error, 4 + m.size());
  put<uint32_t>(out, uint32_t(m.size()));
  out.append(m);
}

std::string decode_error(std::string_view payload) {
  Reader r(payload, "ERROR");
  const uint32_t n = r.get<uint32_t>("message length");
  std::string m(r.take(n, "message"));
  r.done();
  return m;
}

}  // namespace row_stream

// ---- addresses ------------------------------------------------------------------------------

StreamAddress parse_stream_address(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    MT_FAIL("stream address '", text, "': ", why,
            " (expected host:port, e.g. localhost:7070 or 10.0.0.5:7070)");
  };
  const size_t colon = text.rfind(':');
  if (text.empty()) bad("empty");
  if (colon == std::string::npos) bad("no ':port'");
  StreamAddress a;
  a.host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (a.host.empty()) bad("no host before ':'");
  if (a.host.size() > 253) bad("the host name is too long");
  for (char c : a.host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'))
      bad(std::string("the host has the character '") + c + "' (a host name or an IPv4 address)");
  if (port.empty()) bad("no port after ':'");
  if (port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }))
    bad("the port '" + port + "' is not a number from 1 to 65535");
  a.port = std::stoi(port);
  if (a.port < 1 || a.port > 65535) bad("the port " + port + " is not from 1 to 65535");
  return a;
}

// ---- RowStreamClient ------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

std::string mib(int64_t bytes) {
  std::ostringstream os;
  if (bytes % (int64_t(1) << 20) == 0)
    os << bytes / (int64_t(1) << 20) << " MiB";
  else
    os << std::fixed << std::setprecision(1) << double(bytes) / double(1 << 20) << " MiB";
  return os.str();
}

std::string step_range(int64_t first, int64_t last) {
  if (first < 0) return "no step";
  if (first == last) return "step " + std::to_string(first);
  return "steps " + std::to_string(first) + ".." + std::to_string(last);
}

}  // namespace

struct RowStreamClient::Item {
  std::shared_ptr<const runtime::sparse::RowUpdate> update;
  int64_t begin = 0, end = 0;
  int64_t bytes = 0;
};

RowStreamClient::RowStreamClient(StreamAddress address, int64_t queue_limit_bytes, bool send_state,
                                 std::ostream* log)
    : RowStreamClient(std::move(address), RowStreamOptions{.queue_limit_bytes = queue_limit_bytes,
                                                           .send_state = send_state,
                                                           .log = log}) {}

RowStreamClient::RowStreamClient(StreamAddress address, RowStreamOptions options)
    : address_(std::move(address)), options_(options) {
  MT_CHECK(options_.queue_limit_bytes > 0,
           "embedding stream: the send queue limit must be "
           "positive, got ",
           options_.queue_limit_bytes, " bytes");
  MT_CHECK(address_.port >= 1 && address_.port <= 65535 && !address_.host.empty(),
           "embedding stream: bad address '", address_.str(), "'");
  MT_CHECK(pipe2(wake_pipe_, O_NONBLOCK | O_CLOEXEC) == 0,
           "embedding stream: pipe: ", std::strerror(errno));
  thread_ = std::thread([this] { run(); });
}

RowStreamClient::~RowStreamClient() {
  flush(std::chrono::milliseconds(2000));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  room_cv_.notify_all();
  wake();
  thread_.join();
  row_stream::net::close_fd(wake_pipe_[0]);
  row_stream::net::close_fd(wake_pipe_[1]);
}

runtime::sparse::RowUpdateListener RowStreamClient::listener() {
  return [this](std::vector<runtime::sparse::RowUpdate>&& updates) { push(std::move(updates)); };
}

void RowStreamClient::log_line(const std::string& line) {
  if (!options_.log) return;
  std::lock_guard<std::mutex> lock(log_mu_);
  *options_.log << line + "\n" << std::flush;
}

void RowStreamClient::wake() {
  const char c = 1;
  [[maybe_unused]] const ssize_t n = write(wake_pipe_[1], &c, 1);  // full pipe: already awake
}

void RowStreamClient::drop_locked(Item& item, bool outage) {
  const int64_t step = item.update->step, rows = item.end - item.begin;
  stats_.frames_dropped += 1;
  stats_.rows_dropped += rows;
  if (stats_.first_dropped_step < 0 || step < stats_.first_dropped_step)
    stats_.first_dropped_step = step;
  stats_.last_dropped_step = std::max(stats_.last_dropped_step, step);
  if (!outage) return;
  outage_frames_ += 1;
  outage_rows_ += rows;
  if (outage_first_step_ < 0 || step < outage_first_step_) outage_first_step_ = step;
  outage_last_step_ = std::max(outage_last_step_, step);
}

void RowStreamClient::enter_outage_locked(const std::string& why) {
  const bool was_down = state_ == State::Down;
  state_ = State::Down;
  stats_.connected = false;
  for (auto* q : {&inflight_, &pending_}) {
    for (Item& item : *q) {
      drop_locked(item);
      stats_.queued_bytes -= item.bytes;
    }
    q->clear();
  }
  room_cv_.notify_all();
  if (was_down) return;
  stats_.outages += 1;
  log_line("embedding stream: WARNING: the replica at " + address_.str() + " is unreachable (" +
           why + "); training goes on and the replica misses the updates until it is back" +
           (outage_frames_ > 0
                ? " (" + std::to_string(outage_frames_) + " unacknowledged updates dropped)"
                : std::string()));
}

void RowStreamClient::push(std::vector<runtime::sparse::RowUpdate>&& updates) {
  std::vector<Item> items;
  for (auto& u : updates) {
    if (u.rows.empty()) continue;
    row_stream::check_update(u, options_.send_state);
    auto shared = std::make_shared<const runtime::sparse::RowUpdate>(std::move(u));
    const int64_t n = int64_t(shared->rows.size());
    const int64_t row_bytes = std::max<int64_t>(
        1, int64_t(row_stream::update_frame_bytes(*shared, 0, 1, options_.send_state)));
    const int64_t per_frame =
        std::max<int64_t>(1, int64_t(row_stream::kTargetFrameBytes) / row_bytes);
    for (int64_t b = 0; b < n; b += per_frame) {
      Item it{shared, b, std::min(n, b + per_frame), 0};
      it.bytes =
          int64_t(row_stream::update_frame_bytes(*shared, it.begin, it.end, options_.send_state));
      MT_CHECK(uint64_t(it.bytes) <= row_stream::kMaxFramePayload, "embedding stream: a row of ",
               "table '", shared->table, "' takes ", it.bytes, " bytes, over the frame limit");
      items.push_back(std::move(it));
    }
  }
  if (items.empty()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (Item& item : items) {
      if (state_ != State::Down && !stop_ && stats_.queued_bytes > 0 &&
          stats_.queued_bytes + item.bytes > options_.queue_limit_bytes) {
        const auto start = Clock::now();
        stats_.queue_waits += 1;
        waits_since_log_ += 1;
        if (!wait_logged_ || start - last_wait_log_ > std::chrono::seconds(60)) {
          log_line("embedding stream: send queue over " + mib(options_.queue_limit_bytes) + " (" +
                   mib(stats_.queued_bytes) +
                   " not yet acknowledged), training waits for the "
                   "replica at " +
                   address_.str() +
                   (wait_logged_
                        ? " (" + std::to_string(waits_since_log_) + " waits since the last report)"
                        : std::string()));
          wait_logged_ = true;
          last_wait_log_ = start;
          waits_since_log_ = 0;
        }
        room_cv_.wait(lock, [&] {
          return stop_ || state_ == State::Down || stats_.queued_bytes == 0 ||
                 stats_.queued_bytes + item.bytes <= options_.queue_limit_bytes;
        });
        stats_.queue_wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      }
      if (state_ == State::Down || stop_) {
        drop_locked(item);
        continue;
      }
      stats_.queued_bytes += item.bytes;
      pending_.push_back(std::move(item));
    }
  }
  wake();
}

bool RowStreamClient::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return room_cv_.wait_for(lock, timeout, [&] { return pending_.empty() && inflight_.empty(); });
}

RowStreamStats RowStreamClient::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void RowStreamClient::run() {
  using namespace row_stream;
  const auto backoff_initial = std::chrono::duration<double>(options_.initial_backoff_s);
  const auto backoff_max = std::chrono::duration<double>(options_.max_backoff_s);
  const auto stall = std::chrono::duration<double>(options_.stall_timeout_s);
  auto backoff = backoff_initial;
  int fd = -1;
  std::string out;  // the frame being written
  size_t out_pos = 0;
  std::string in;  // bytes read from the replica
  auto last_progress = Clock::now();
  bool ever_connected = false;

  const auto wait_backoff = [&] {
    std::unique_lock<std::mutex> lock(mu_);
    room_cv_.wait_for(lock, backoff, [&] { return stop_; });
    backoff = std::min<std::chrono::duration<double>>(backoff * 2, backoff_max);
  };
  const auto broken = [&](const std::string& why) {
    net::close_fd(fd);
    fd = -1;
    out.clear();
    out_pos = 0;
    in.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      enter_outage_locked(why);
    }
    wait_backoff();
  };

  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
    }
    if (fd < 0) {
      std::string error;
      fd = net::connect_tcp(address_.host, address_.port, options_.connect_timeout_s, &error);
      if (fd < 0) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          enter_outage_locked(error);
        }
        wait_backoff();
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (state_ == State::Down) {
        log_line("embedding stream: connected again to the replica at " + address_.str() +
                 "; it missed " + std::to_string(outage_frames_) + " updates (" +
                 std::to_string(outage_rows_) + " rows) of " +
                 step_range(outage_first_step_, outage_last_step_) +
                 " while unreachable: those rows stay stale there until training updates them "
                 "again");
      } else if (!ever_connected) {
        log_line("embedding stream: connected to the replica at " + address_.str());
      }
      ever_connected = true;
      outage_frames_ = outage_rows_ = 0;
      outage_first_step_ = outage_last_step_ = -1;
      state_ = State::Connected;
      stats_.connected = true;
      stats_.connects += 1;
      backoff = backoff_initial;
      last_progress = Clock::now();
    }

    // Next frame to write.
    bool idle = false;
    if (out_pos == out.size()) {
      out.clear();
      out_pos = 0;
      std::optional<Item> next;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!pending_.empty()) {
          next = pending_.front();
          pending_.pop_front();
          inflight_.push_back(*next);
        }
        idle = pending_.empty() && inflight_.empty() && !next;
      }
      if (next) {
        try {
          encode_update(out, *next->update, next->begin, next->end, options_.send_state);
        } catch (const std::exception& e) {  // checked in push(): not expected
          broken(std::string("cannot encode an update: ") + e.what());
          continue;
        }
      }
    }
    if (idle) last_progress = Clock::now();

    pollfd fds[2] = {{fd, short(POLLIN | (out_pos < out.size() ? POLLOUT : 0)), 0},
                     {wake_pipe_[0], POLLIN, 0}};
    const int n = poll(fds, 2, 200);
    if (n < 0 && errno != EINTR) {
      broken(std::string("poll: ") + std::strerror(errno));
      continue;
    }
    if (fds[1].revents & POLLIN) {
      char drain[256];
      while (read(wake_pipe_[0], drain, sizeof(drain)) > 0) {
      }
    }
    bool failed = false;
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[4096];
      const ssize_t got = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (got == 0) {
        broken("the replica closed the connection");
        continue;
      }
      if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        broken(std::strerror(errno));
        continue;
      }
      if (got > 0) in.append(buf, size_t(got));
      while (!failed && in.size() >= kHeaderBytes) {
        FrameHeader h;
        try {
          h = decode_header(reinterpret_cast<const std::byte*>(in.data()));
        } catch (const std::exception& e) {
          broken(std::string("bad frame from the replica: ") + e.what());
          failed = true;
          break;
        }
        if (in.size() < kHeaderBytes + h.payload_bytes) break;
        const std::string_view payload(in.data() + kHeaderBytes, h.payload_bytes);
        std::string problem;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (inflight_.empty() || (h.type != FrameType::Ack && h.type != FrameType::Error)) {
            problem = "unexpected frame type " + std::to_string(int(h.type)) + " from the replica";
          } else if (h.type == FrameType::Ack) {
            Item item = std::move(inflight_.front());
            inflight_.pop_front();
            stats_.frames_sent += 1;
            stats_.rows_sent += item.end - item.begin;
            stats_.bytes_sent += item.bytes;
            stats_.queued_bytes -= item.bytes;
          } else {  // the replica refused this update: the replica misses it
            Item item = std::move(inflight_.front());
            inflight_.pop_front();
            drop_locked(item, /*outage=*/false);
            stats_.queued_bytes -= item.bytes;
            std::string message;
            try {
              message = decode_error(payload);
            } catch (const std::exception& e) {
              message = e.what();
            }
            log_line("embedding stream: the replica at " + address_.str() +
                     " refused the update of table '" + item.update->table + "' (step " +
                     std::to_string(item.update->step) + "): " + message);
          }
          room_cv_.notify_all();
        }
        if (!problem.empty()) {
          broken(problem);
          failed = true;
          break;
        }
        in.erase(0, kHeaderBytes + h.payload_bytes);
        last_progress = Clock::now();
      }
      if (failed) continue;
    }
    if (fd >= 0 && out_pos < out.size() && (fds[0].revents & POLLOUT)) {
      const ssize_t sent =
          send(fd, out.data() + out_pos, out.size() - out_pos, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent > 0) {
        out_pos += size_t(sent);
        last_progress = Clock::now();
      } else if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        broken(std::strerror(errno));
        continue;
      }
    }
    if (fd >= 0 && !idle && Clock::now() - last_progress > stall) {
      std::ostringstream why;
      why << "no progress for " << options_.stall_timeout_s << " s";
      broken(why.str());
    }
  }
  net::close_fd(fd);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto* q : {&inflight_, &pending_}) {
    for (Item& item : *q) {
      drop_locked(item);
      stats_.queued_bytes -= item.bytes;
    }
    q->clear();
  }
  stats_.connected = false;
  room_cv_.notify_all();
}

}  // namespace mt::parallel
