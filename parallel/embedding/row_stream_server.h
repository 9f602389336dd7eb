// RowStreamServer: the serving replica's side of the row stream (row_stream.h has the wire
// format): receives UPDATE frames from trainers into its own KvStore and answers LOOKUP frames,
// on one TCP port, several connections at once (a thread each). mt_embedding_server runs it.
//
// Storage (runtime/sparse/kv/kv_store.h, opened persistent: a restarted replica keeps its rows).
// Each table name gets a table id on its first update, recorded in the store's metadata as
//   "stream.table/<name>" -> "<id> <embedding_dim> <f32|f64>"   (next id: "stream.next_table_id")
//   "stream.step/<name>"  -> the last step applied
// and its rows are stored whole (embedding_dim values). A column shard's frame writes its columns
// of each row (read-modify-write, serialised across connections so two shards of one row never
// lose each other's columns); columns never written read as zeros. Optimizer state blocks, when
// sent, are stored as tables of their own, named "<table>#<state>@<col_offset>" (one per column
// shard, width as sent), and can be looked up by that name.
//
// Errors: an update inconsistent with the stored table (another embedding_dim or dtype) is refused
// with an ERROR reply, logged and counted, and the connection stays open; a bad frame (wrong magic
// or version, truncated, sizes that do not add up, a frame type a client does not send) gets an
// ERROR reply, a logged line, and that connection is closed. Neither stops the server.
// A --db folder that holds anything but a kv store is refused (mt::Error), as is one locked by
// another process.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "parallel/embedding/row_stream.h"

namespace mt::runtime::sparse {
class KvStore;
}

namespace mt::parallel {

struct RowStreamServerOptions {
  std::filesystem::path db;           // the replica's store (created when missing)
  int port = 0;                       // 0: a free port (see port())
  std::string bind_host = "0.0.0.0";  // "127.0.0.1": loopback only
  std::ostream* log = nullptr;        // connections, errors; null = silent
};

struct RowStreamServerStats {
  int64_t updates_applied = 0;  // UPDATE frames written
  int64_t rows_applied = 0;
  int64_t updates_refused = 0;  // inconsistent with the stored table
  int64_t bad_frames = 0;       // connections closed for a bad frame
  int64_t lookups = 0;
  int64_t connections_accepted = 0;
  int64_t connections_open = 0;
};

class RowStreamServer {
 public:
  explicit RowStreamServer(RowStreamServerOptions options);
  ~RowStreamServer();  // stop()
  RowStreamServer(const RowStreamServer&) = delete;
  RowStreamServer& operator=(const RowStreamServer&) = delete;

  int port() const { return port_; }
  const std::filesystem::path& db() const { return options_.db; }
  // Closes the port and every connection, joins the threads. Idempotent.
  void stop();

  // Writes one decoded update (what an UPDATE frame does); mt::Error when it does not fit the
  // stored table.
  void apply(const row_stream::UpdateFrame& update);
  // The rows `ids` of `table` (zeros and found = false for rows never written); mt::Error for a
  // table never streamed.
  row_stream::LookupResult lookup(const std::string& table, const std::vector<int64_t>& ids) const;
  // The last step applied to `table` (none for a table never streamed).
  std::optional<int64_t> last_step(const std::string& table) const;

  // While paused, connections read no more frames (tests of a slow replica).
  void set_paused(bool paused);
  RowStreamServerStats stats() const;

 private:
  struct TableInfo {
    uint32_t id = 0;
    int64_t dim = 0;
    row_stream::WireDType dtype = row_stream::WireDType::F32;
  };
  struct Connection {
    int fd = -1;
    std::string peer;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void accept_loop();
  void serve(Connection* c);
  void log_line(const std::string& line) const;
  std::optional<TableInfo> find_table_locked(const std::string& name) const;
  TableInfo table_for_locked(const std::string& name, int64_t dim, row_stream::WireDType dtype);
  void reap_locked(bool all);

  RowStreamServerOptions options_;
  std::shared_ptr<runtime::sparse::KvStore> store_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  mutable std::mutex apply_mu_;  // table ids, metadata, read-modify-write of rows
  mutable std::map<std::string, TableInfo> tables_;
  mutable std::mutex mu_;  // connections, pause, stats
  std::condition_variable pause_cv_;
  bool paused_ = false;
  bool stopping_ = false;
  std::list<std::unique_ptr<Connection>> connections_;
  mutable RowStreamServerStats stats_;
  mutable std::mutex log_mu_;
  std::thread accept_thread_;
};

// A LOOKUP over TCP to a replica at `address` (the mt_embedding_server --lookup client):
// mt::Error when it cannot connect, the replica answers with an error (e.g. an unknown table),
// or no answer comes within timeout_s.
row_stream::LookupResult lookup_remote(const StreamAddress& address, const std::string& table,
                                       const std::vector<int64_t>& ids, double timeout_s = 10.0);

}  // namespace mt::parallel
