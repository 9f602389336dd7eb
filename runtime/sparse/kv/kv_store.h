// KvStore: a RocksDB database of fixed-width byte rows, keyed by (table id, row id), for the
// kv-backed embedding tables (kv_table.h) and the serving replica (tools/mt_embedding_server).
//
// Keys are 4 bytes of table id then 8 bytes of row id, both big-endian, so a scan walks one table
// in row order. A table's rows all have the width given with its id (values of another size are
// reported as corruption, naming the database, table and row). Named metadata strings live
// beside the rows under keys that cannot collide with row keys.
//
// Opening:
//   open_scratch  a working store that starts empty: an existing minititan store at `path` is
//                 destroyed first (training rebuilds its tables from a checkpoint); a path that
//                 holds anything else is refused rather than deleted.
//   open          an existing store is kept (the replica's), a new one created.
// Errors (mt::Error) name the path: a folder that cannot be created, a database RocksDB reports
// as corrupt or locked by another process, a failed read or write.
// Thread safety: reads, writes and scans may run on different threads at once (RocksDB's own
// guarantee); the counters are atomic. background() runs tasks in order on one of two worker
// threads, one for reads (the prefetches of all of a store's tables) and one for writes.
// Tuning: point lookups (bloom filters, a block cache); a scratch store writes no WAL (it is
// rebuilt from a checkpoint after a crash anyway).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rocksdb {
class DB;
class Snapshot;
}  // namespace rocksdb

namespace mt::runtime::sparse {

class KvStore {
 public:
  // A consistent read view (RocksDB snapshot), released when the last copy goes.
  class View;

  static std::shared_ptr<KvStore> open_scratch(const std::filesystem::path& path);
  static std::shared_ptr<KvStore> open(const std::filesystem::path& path);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const std::filesystem::path& path() const { return path_; }

  // Looks up `keys` of `table` (rows of `width` bytes): found rows are copied to
  // out + i * width and flagged. One batched RocksDB MultiGet.
  std::vector<bool> multi_get(uint32_t table, const std::vector<int64_t>& keys, size_t width,
                              std::byte* out, const View* view = nullptr) const;
  // Writes rows[i * width, +width) under keys[i], atomically (one write batch).
  void put(uint32_t table, const std::vector<int64_t>& keys, size_t width, const std::byte* rows);
  // Calls fn(row, bytes) for the rows of `table` with first <= row < end, in row order.
  void scan(uint32_t table, int64_t first, int64_t end, size_t width,
            const std::function<void(int64_t row, const std::byte* bytes)>& fn,
            const View* view = nullptr) const;
  // Number of rows of `table` (a scan).
  int64_t count(uint32_t table, size_t width) const;
  // Deletes every row of `table`.
  void erase_table(uint32_t table);

  std::optional<std::string> get_meta(const std::string& name) const;
  void put_meta(const std::string& name, const std::string& value);

  std::shared_ptr<const View> view() const;

  // Runs `task` on the store's read or write worker, after the tasks submitted to it before.
  enum class Lane { Read, Write };
  std::future<void> background(Lane lane, std::function<void()> task);

  // Bytes of row values read and written since opening.
  uint64_t bytes_read() const { return bytes_read_.load(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }

 private:
  KvStore(std::filesystem::path path, rocksdb::DB* db, bool write_ahead_log);
  static std::shared_ptr<KvStore> open_with(const std::filesystem::path& path,
                                            bool write_ahead_log);
  std::string describe_key(uint32_t table, int64_t row) const;

  std::filesystem::path path_;
  std::unique_ptr<rocksdb::DB> db_;
  bool write_ahead_log_;
  // A thread running tasks in order, started by the first submit.
  class Worker {
   public:
    ~Worker();
    std::future<void> submit(std::function<void()> task);

   private:
    void work();
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::packaged_task<void()>> tasks_;
    bool stopping_ = false;
    std::thread thread_;
  };
  Worker readers_, writers_;
  mutable std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0};
};

class KvStore::View {
 public:
  View(rocksdb::DB* db, const rocksdb::Snapshot* snapshot) : db_(db), snapshot_(snapshot) {}
  ~View();
  View(const View&) = delete;
  View& operator=(const View&) = delete;
  const rocksdb::Snapshot* snapshot() const { return snapshot_; }

 private:
  rocksdb::DB* db_;
  const rocksdb::Snapshot* snapshot_;
};

}  // namespace mt::runtime::sparse
