#include "parallel/embedding/row_stream_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "parallel/embedding/row_stream_socket.h"
#include "runtime/core/error.h"
#include "runtime/sparse/kv/kv_store.h"

namespace mt::parallel {

namespace fs = std::filesystem;
using namespace row_stream;

namespace {

constexpr const char* kTableMeta = "stream.table/";
constexpr const char* kStepMeta = "stream.step/";
constexpr const char* kNextIdMeta = "stream.next_table_id";
constexpr int kReplyTimeoutMs = 60000;
constexpr size_t kReadChunk = size_t(1) << 20;

const char* dtype_word(WireDType d) { return d == WireDType::F64 ? "f64" : "f32"; }

// Refused updates (mt::Error from apply) are answered with an ERROR frame; bad frames close.
struct BadFrame : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

RowStreamServer::RowStreamServer(RowStreamServerOptions options) : options_(std::move(options)) {
  const fs::path& db = options_.db;
  MT_CHECK(!db.empty(), "embedding server: no database folder given (--db DIR)");
  std::error_code ec;
  if (fs::exists(db, ec)) {
    MT_CHECK(fs::is_directory(db, ec), "embedding server: ", db.string(),
             " is a file, not a folder (--db names the replica's kv store folder)");
    MT_CHECK(fs::is_empty(db, ec) || fs::exists(db / "CURRENT", ec),
             "embedding server: ", db.string(),
             " is not a kv store (it holds other files): give a new or empty ",
             "folder, or one an earlier mt_embedding_server wrote");
  }
  store_ = runtime::sparse::KvStore::open(db);
  listen_fd_ = net::listen_tcp(options_.bind_host, options_.port, &port_);
  if (pipe2(wake_pipe_, O_NONBLOCK | O_CLOEXEC) != 0) {
    net::close_fd(listen_fd_);
    MT_FAIL("embedding server: pipe: ", std::strerror(errno));
  }
  accept_thread_ = std::thread([this] { accept_loop(); });
}

RowStreamServer::~RowStreamServer() { stop(); }

void RowStreamServer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !accept_thread_.joinable()) return;
    stopping_ = true;
  }
  pause_cv_.notify_all();
  const char c = 1;
  [[maybe_unused]] const ssize_t w = write(wake_pipe_[1], &c, 1);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Connection>> connections;
  {
    std::lock_guard<std::mutex> lock(mu_);
    connections.swap(connections_);
  }
  for (auto& conn : connections) shutdown(conn->fd, SHUT_RDWR);
  for (auto& conn : connections) {
    if (conn->thread.joinable()) conn->thread.join();
    net::close_fd(conn->fd);
  }
  net::close_fd(listen_fd_);
  net::close_fd(wake_pipe_[0]);
  net::close_fd(wake_pipe_[1]);
  listen_fd_ = wake_pipe_[0] = wake_pipe_[1] = -1;
}

void RowStreamServer::log_line(const std::string& line) const {
  if (!options_.log) return;
  std::lock_guard<std::mutex> lock(log_mu_);
  *options_.log << line + "\n" << std::flush;
}

void RowStreamServer::set_paused(bool paused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = paused;
  }
  pause_cv_.notify_all();
}

RowStreamServerStats RowStreamServer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void RowStreamServer::reap_locked(bool all) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (all || (*it)->done.load()) {
      if ((*it)->thread.joinable()) (*it)->thread.join();
      net::close_fd((*it)->fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void RowStreamServer::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    const int n = poll(fds, 2, 500);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      reap_locked(false);
    }
    if (n <= 0 || !(fds[0].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        log_line(std::string("embedding server: cannot accept a connection: ") +
                 std::strerror(errno));
        usleep(100000);
      }
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto conn = std::make_unique<Connection>();
    conn->fd = fd;
    conn->peer = net::peer_name(fd);
    log_line("embedding server: connection from " + conn->peer);
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      net::close_fd(fd);
      return;
    }
    stats_.connections_accepted += 1;
    stats_.connections_open += 1;
    Connection* raw = conn.get();
    connections_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] { serve(raw); });
  }
}

void RowStreamServer::serve(Connection* c) {
  std::string header(kHeaderBytes, '\0');
  std::string payload, reply;
  const auto stopping = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  };
  try {
    for (;;) {
      size_t got = 0;
      std::string error;
      net::RecvStatus st = net::recv_exact(c->fd, header.data(), kHeaderBytes, -1, &got, &error);
      if (st == net::RecvStatus::Closed && got == 0) break;  // the peer is done
      if (st != net::RecvStatus::Ok) {
        if (stopping()) break;
        if (st == net::RecvStatus::Closed)
          throw BadFrame("truncated frame header: the connection closed after " +
                         std::to_string(got) + " of " + std::to_string(kHeaderBytes) + " bytes");
        log_line("embedding server: reading from " + c->peer + " failed: " + error);
        break;
      }
      FrameHeader h;
      try {
        h = decode_header(reinterpret_cast<const std::byte*>(header.data()));
      } catch (const std::exception& e) {
        throw BadFrame(e.what());
      }
      // Grows with the data that arrives: a lying length allocates nothing it does not receive.
      payload.clear();
      while (payload.size() < h.payload_bytes) {
        const size_t have = payload.size();
        const size_t chunk = std::min<uint64_t>(kReadChunk, h.payload_bytes - have);
        payload.resize(have + chunk);
        st = net::recv_exact(c->fd, payload.data() + have, chunk, -1, &got, &error);
        if (st == net::RecvStatus::Ok) continue;
        if (stopping()) throw std::runtime_error("the server stops");
        if (st == net::RecvStatus::Closed)
          throw BadFrame("truncated frame: the header announces " +
                         std::to_string(h.payload_bytes) +
                         " payload bytes, the connection "
                         "closed after " +
                         std::to_string(have + got));
        log_line("embedding server: reading from " + c->peer + " failed: " + error);
        throw std::runtime_error("read failed");
      }
      {  // a paused replica holds the frame it has read (tests of a slow replica)
        std::unique_lock<std::mutex> lock(mu_);
        pause_cv_.wait(lock, [&] { return !paused_ || stopping_; });
        if (stopping_) break;
      }
      reply.clear();
      if (h.type == FrameType::Update) {
        UpdateFrame f;
        try {
          f = decode_update(payload);
        } catch (const std::exception& e) {
          throw BadFrame(e.what());
        }
        try {
          apply(f);
          encode_ack(reply, Ack{f.step, int64_t(f.rows.size())});
        } catch (const Error& e) {
          log_line("embedding server: refused an update from " + c->peer + ": " + e.what());
          {
            std::lock_guard<std::mutex> lock(mu_);
            stats_.updates_refused += 1;
          }
          encode_error(reply, e.what());
        }
      } else if (h.type == FrameType::Lookup) {
        LookupRequest q;
        try {
          q = decode_lookup(payload);
        } catch (const std::exception& e) {
          throw BadFrame(e.what());
        }
        try {
          encode_lookup_reply(reply, lookup(q.table, q.rows));
        } catch (const Error& e) {
          encode_error(reply, e.what());
        }
      } else {
        throw BadFrame("a client sends UPDATE (1) or LOOKUP (3) frames, got type " +
                       std::to_string(int(h.type)));
      }
      if (!net::send_all(c->fd, reply.data(), reply.size(), kReplyTimeoutMs, &error)) {
        if (!stopping())
          log_line("embedding server: answering " + c->peer + " failed: " + error +
                   "; closing the connection");
        break;
      }
    }
  } catch (const BadFrame& e) {
    log_line("embedding server: bad frame from " + c->peer + ": " + e.what() +
             "; closing the connection");
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bad_frames += 1;
    }
    std::string error_frame, ignored;
    encode_error(error_frame, std::string("bad frame: ") + e.what());
    net::send_all(c->fd, error_frame.data(), error_frame.size(), 1000, &ignored);
  } catch (const std::exception& e) {
    log_line("embedding server: connection from " + c->peer + " ends: " + e.what());
  }
  shutdown(c->fd, SHUT_RDWR);
  log_line("embedding server: " + c->peer + " disconnected");
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.connections_open -= 1;
  }
  c->done = true;
}

std::optional<RowStreamServer::TableInfo> RowStreamServer::find_table_locked(
    const std::string& name) const {
  if (auto it = tables_.find(name); it != tables_.end()) return it->second;
  const std::optional<std::string> meta = store_->get_meta(kTableMeta + name);
  if (!meta) return std::nullopt;
  std::istringstream in(*meta);
  TableInfo t;
  int64_t id = -1;
  std::string dtype;
  in >> id >> t.dim >> dtype;
  MT_CHECK(in && id >= 0 && t.dim >= 1 && (dtype == "f32" || dtype == "f64"),
           "embedding server: ", options_.db.string(), ": bad metadata for table '", name, "': '",
           *meta, "' (expected '<id> <embedding_dim> <f32|f64>')");
  t.id = uint32_t(id);
  t.dtype = dtype == "f64" ? WireDType::F64 : WireDType::F32;
  tables_[name] = t;
  return t;
}

RowStreamServer::TableInfo RowStreamServer::table_for_locked(const std::string& name, int64_t dim,
                                                             WireDType dtype) {
  if (auto t = find_table_locked(name)) return *t;
  const std::optional<std::string> next = store_->get_meta(kNextIdMeta);
  TableInfo t;
  t.id = next ? uint32_t(std::stoul(*next)) : 1;
  t.dim = dim;
  t.dtype = dtype;
  store_->put_meta(kNextIdMeta, std::to_string(t.id + 1));
  store_->put_meta(kTableMeta + name,
                   std::to_string(t.id) + " " + std::to_string(dim) + " " + dtype_word(dtype));
  tables_[name] = t;
  return t;
}

void RowStreamServer::apply(const UpdateFrame& f) {
  std::lock_guard<std::mutex> lock(apply_mu_);
  // Check every table the frame writes before writing anything.
  struct Target {
    std::string name;
    int64_t dim;
    WireDType dtype;
  };
  std::vector<Target> targets{{f.table, f.embedding_dim, f.dtype}};
  for (const auto& s : f.state)
    targets.push_back(
        {f.table + "#" + s.name + "@" + std::to_string(f.col_offset), s.width, s.dtype});
  for (const Target& t : targets) {
    if (auto info = find_table_locked(t.name)) {
      MT_CHECK(info->dim == t.dim && info->dtype == t.dtype, "table '", t.name, "' is stored with ",
               "embedding_dim ", info->dim, " ", dtype_word(info->dtype), " in ",
               options_.db.string(), "; the update (step ", f.step, ") has embedding_dim ", t.dim,
               " ", dtype_word(t.dtype), " (a trainer with another config? serve it from a ",
               "fresh --db)");
    }
  }
  const size_t n = f.rows.size();
  const TableInfo table = table_for_locked(f.table, f.embedding_dim, f.dtype);
  const size_t elem = wire_size(f.dtype);
  const size_t width = size_t(table.dim) * elem;
  const auto* values = reinterpret_cast<const std::byte*>(f.values.data());
  if (f.col_offset == 0 && f.cols == f.embedding_dim) {
    store_->put(table.id, f.rows, width, values);
  } else {  // a column shard: its columns of each row, the others as stored (zeros if none)
    std::vector<std::byte> rows(n * width, std::byte{0});
    store_->multi_get(table.id, f.rows, width, rows.data());
    const size_t cols_bytes = size_t(f.cols) * elem;
    for (size_t i = 0; i < n; ++i)
      std::memcpy(rows.data() + i * width + size_t(f.col_offset) * elem, values + i * cols_bytes,
                  cols_bytes);
    store_->put(table.id, f.rows, width, rows.data());
  }
  for (size_t s = 0; s < f.state.size(); ++s) {
    const auto& st = f.state[s];
    const TableInfo info = table_for_locked(targets[s + 1].name, st.width, st.dtype);
    store_->put(info.id, f.rows, size_t(st.width) * wire_size(st.dtype),
                reinterpret_cast<const std::byte*>(st.values.data()));
  }
  store_->put_meta(kStepMeta + f.table, std::to_string(f.step));
  std::lock_guard<std::mutex> stats_lock(mu_);
  stats_.updates_applied += 1;
  stats_.rows_applied += int64_t(n);
}

LookupResult RowStreamServer::lookup(const std::string& table,
                                     const std::vector<int64_t>& ids) const {
  std::optional<TableInfo> info;
  {
    std::lock_guard<std::mutex> lock(apply_mu_);
    info = find_table_locked(table);
  }
  MT_CHECK(info, "embedding server: no table '", table, "' in ", options_.db.string(),
           " (no update of it has been streamed)");
  const int64_t n = int64_t(ids.size());
  LookupResult r;
  r.table = table;
  r.values = Tensor::empty({n, info->dim}, TensorOptions{}.with_dtype(to_dtype(info->dtype)));
  const size_t width = size_t(info->dim) * wire_size(info->dtype);
  auto* out = static_cast<std::byte*>(r.values.data_ptr());
  if (n > 0) std::memset(out, 0, size_t(n) * width);
  r.found = store_->multi_get(info->id, ids, width, out);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.lookups += 1;
  return r;
}

std::optional<int64_t> RowStreamServer::last_step(const std::string& table) const {
  const std::optional<std::string> v = store_->get_meta(kStepMeta + table);
  if (!v) return std::nullopt;
  return std::stoll(*v);
}

LookupResult lookup_remote(const StreamAddress& address, const std::string& table,
                           const std::vector<int64_t>& ids, double timeout_s) {
  std::string error;
  const int fd = net::connect_tcp(address.host, address.port, timeout_s, &error);
  MT_CHECK(fd >= 0, "embedding lookup: cannot connect to ", address.str(), ": ", error);
  struct Closer {
    int fd;
    ~Closer() { net::close_fd(fd); }
  } closer{fd};
  std::string request;
  encode_lookup(request, LookupRequest{table, ids});
  const int timeout_ms = int(timeout_s * 1000);
  MT_CHECK(net::send_all(fd, request.data(), request.size(), timeout_ms, &error),
           "embedding lookup: sending to ", address.str(), " failed: ", error);
  std::string header(kHeaderBytes, '\0');
  size_t got = 0;
  net::RecvStatus st = net::recv_exact(fd, header.data(), kHeaderBytes, timeout_ms, &got, &error);
  MT_CHECK(st == net::RecvStatus::Ok, "embedding lookup: no answer from ", address.str(), ": ",
           st == net::RecvStatus::Closed ? "the connection closed" : error);
  FrameHeader h;
  try {
    h = decode_header(reinterpret_cast<const std::byte*>(header.data()));
  } catch (const std::exception& e) {
    MT_FAIL("embedding lookup: ", address.str(), " answered: ", e.what());
  }
  std::string payload(h.payload_bytes, '\0');
  st = net::recv_exact(fd, payload.data(), payload.size(), timeout_ms, &got, &error);
  MT_CHECK(st == net::RecvStatus::Ok, "embedding lookup: the answer from ", address.str(),
           " is truncated: ", st == net::RecvStatus::Closed ? "the connection closed" : error);
  if (h.type == FrameType::Error)
    MT_FAIL("embedding lookup: ", address.str(), " answered: ", decode_error(payload));
  MT_CHECK(h.type == FrameType::LookupReply, "embedding lookup: ", address.str(),
           " answered with frame type ", int(h.type), ", expected LOOKUP_REPLY (4)");
  LookupResult r = decode_lookup_reply(payload);
  MT_CHECK(r.found.size() == ids.size(), "embedding lookup: ", address.str(), " answered ",
           r.found.size(), " rows for ", ids.size(), " ids");
  return r;
}

}  // namespace mt::parallel
