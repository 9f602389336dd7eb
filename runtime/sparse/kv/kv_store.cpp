#include "runtime/sparse/kv/kv_store.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <cstring>

#include "runtime/core/error.h"

namespace mt::runtime::sparse {

namespace fs = std::filesystem;

namespace {

// Row keys: 4 + 8 bytes, big-endian. Metadata keys start with a byte no table id uses in
// practice and are longer, so they never equal a row key; scans check the length too.
constexpr size_t kKeyBytes = 12;
constexpr const char* kMetaPrefix = "\xff" "minititan.meta.";
constexpr const char* kMarker = "store";  // meta "store" = kFormat marks a minititan store
constexpr const char* kFormat = "minititan-kv-v1";

std::string row_key(uint32_t table, int64_t row) {
  std::string k(kKeyBytes, '\0');
  for (int i = 0; i < 4; ++i) k[size_t(i)] = char((table >> (24 - 8 * i)) & 0xff);
  const uint64_t r = uint64_t(row) ^ (uint64_t(1) << 63);  // signed order as unsigned bytes
  for (int i = 0; i < 8; ++i) k[size_t(4 + i)] = char((r >> (56 - 8 * i)) & 0xff);
  return k;
}

int64_t row_of(const rocksdb::Slice& key) {
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r = (r << 8) | uint8_t(key[size_t(4 + i)]);
  return int64_t(r ^ (uint64_t(1) << 63));
}

void check(const rocksdb::Status& s, const fs::path& path, const std::string& what) {
  // RocksDB holds a LOCK file while a database is open: in another process, this one waits.
  const bool locked = s.IsIOError() && s.ToString().find("lock") != std::string::npos;
  MT_CHECK(s.ok(), "kv store ", path.string(), ": ", what, " failed: ", s.ToString(),
           s.IsCorruption() ? " (the database is corrupt: delete the folder, or restore it)"
           : locked ? " (another process, a trainer or mt_embedding_server, has it open)"
                    : "");
}

rocksdb::DB* open_db(const fs::path& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  MT_CHECK(!ec && fs::is_directory(path), "kv store: cannot create the folder ", path.string(),
           ": ", ec ? ec.message() : "a file of that name is in the way");
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.max_open_files = 256;
  options.write_buffer_size = 64 << 20;
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_cache = rocksdb::NewLRUCache(64 << 20);
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DB* db = nullptr;
  check(rocksdb::DB::Open(options, path.string(), &db), path, "opening the database");
  return db;
}

}  // namespace

KvStore::KvStore(fs::path path, rocksdb::DB* db, bool write_ahead_log)
    : path_(std::move(path)), db_(db), write_ahead_log_(write_ahead_log) {}

KvStore::~KvStore() = default;  // the workers finish their tasks first

KvStore::Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::future<void> KvStore::background(Lane lane, std::function<void()> task) {
  return (lane == Lane::Read ? readers_ : writers_).submit(std::move(task));
}

std::future<void> KvStore::Worker::submit(std::function<void()> task) {
  std::packaged_task<void()> job(std::move(task));
  std::future<void> done = job.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { work(); });
  }
  wake_.notify_one();
  return done;
}

void KvStore::Worker::work() {
  for (;;) {
    std::packaged_task<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, nothing left
      job = std::move(tasks_.front());
      tasks_.pop_front();
    }
    job();  // exceptions reach the future
  }
}

KvStore::View::~View() { db_->ReleaseSnapshot(snapshot_); }

std::shared_ptr<KvStore> KvStore::open(const fs::path& path) {
  return open_with(path, true);
}

std::shared_ptr<KvStore> KvStore::open_with(const fs::path& path, bool write_ahead_log) {
  std::shared_ptr<KvStore> store(new KvStore(path, open_db(path), write_ahead_log));
  const std::optional<std::string> format = store->get_meta(kMarker);
  if (!format) {
    // A new store, or a RocksDB database we did not make: only an empty one is adopted.
    std::unique_ptr<rocksdb::Iterator> it(store->db_->NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    MT_CHECK(!it->Valid(), "kv store ", path.string(),
             ": the folder holds a RocksDB database that is not a minititan kv store");
    check(it->status(), path, "reading");
    store->put_meta(kMarker, kFormat);
  } else {
    MT_CHECK(*format == kFormat, "kv store ", path.string(), ": format '", *format,
             "', expected '", kFormat, "'");
  }
  return store;
}

std::shared_ptr<KvStore> KvStore::open_scratch(const fs::path& path) {
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_empty(path, ec)) {
    // Destroy only what we made: a minititan store (opened and checked first).
    MT_CHECK(fs::exists(path / "CURRENT"), "kv store: ", path.string(),
             " is not empty and is not a kv store; refusing to delete it (choose another "
             "embedding.kv_path)");
    open(path).reset();
    const rocksdb::Status s = rocksdb::DestroyDB(path.string(), rocksdb::Options());
    check(s, path, "clearing the previous run's store");
  }
  return open_with(path, false);
}

std::vector<bool> KvStore::multi_get(uint32_t table, const std::vector<int64_t>& keys,
                                     size_t width, std::byte* out, const View* view) const {
  std::vector<std::string> key_bytes;
  key_bytes.reserve(keys.size());
  for (int64_t k : keys) key_bytes.push_back(row_key(table, k));
  std::vector<rocksdb::Slice> slices(key_bytes.begin(), key_bytes.end());
  std::vector<std::string> values;
  rocksdb::ReadOptions ro;
  if (view) ro.snapshot = view->snapshot();
  const std::vector<rocksdb::Status> status = db_->MultiGet(ro, slices, &values);
  std::vector<bool> found(keys.size(), false);
  uint64_t read = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (status[i].IsNotFound()) continue;
    check(status[i], path_, "reading " + describe_key(table, keys[i]));
    MT_CHECK(values[i].size() == width, "kv store ", path_.string(), ": ",
             describe_key(table, keys[i]), " holds ", values[i].size(), " bytes, expected ", width,
             " (the database is corrupt or was written with other table settings)");
    std::memcpy(out + i * width, values[i].data(), width);
    found[i] = true;
    read += width;
  }
  bytes_read_ += read;
  return found;
}

void KvStore::put(uint32_t table, const std::vector<int64_t>& keys, size_t width,
                  const std::byte* rows) {
  if (keys.empty()) return;
  rocksdb::WriteBatch batch;
  for (size_t i = 0; i < keys.size(); ++i)
    batch.Put(row_key(table, keys[i]),
              rocksdb::Slice(reinterpret_cast<const char*>(rows + i * width), width));
  rocksdb::WriteOptions wo;
  wo.disableWAL = !write_ahead_log_;
  check(db_->Write(wo, &batch), path_, "writing " + std::to_string(keys.size()) + " rows");
  bytes_written_ += keys.size() * width;
}

void KvStore::scan(uint32_t table, int64_t first, int64_t end, size_t width,
                   const std::function<void(int64_t, const std::byte*)>& fn,
                   const View* view) const {
  if (first >= end) return;
  rocksdb::ReadOptions ro;
  if (view) ro.snapshot = view->snapshot();
  const std::string upper = row_key(table, end);
  const rocksdb::Slice upper_slice(upper);
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  uint64_t read = 0;
  for (it->Seek(row_key(table, first)); it->Valid(); it->Next()) {
    if (it->key().size() != kKeyBytes) continue;
    const int64_t row = row_of(it->key());
    MT_CHECK(it->value().size() == width, "kv store ", path_.string(), ": ",
             describe_key(table, row), " holds ", it->value().size(), " bytes, expected ", width,
             " (the database is corrupt or was written with other table settings)");
    fn(row, reinterpret_cast<const std::byte*>(it->value().data()));
    read += width;
  }
  check(it->status(), path_, "scanning table " + std::to_string(table));
  bytes_read_ += read;
}

int64_t KvStore::count(uint32_t table, size_t width) const {
  int64_t n = 0;
  scan(table, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), width,
       [&](int64_t, const std::byte*) { ++n; });
  return n;
}

void KvStore::erase_table(uint32_t table) {
  rocksdb::WriteOptions wo;
  check(db_->DeleteRange(wo, db_->DefaultColumnFamily(),
                         row_key(table, std::numeric_limits<int64_t>::min()),
                         row_key(table + 1, std::numeric_limits<int64_t>::min())),
        path_, "erasing table " + std::to_string(table));
}

std::optional<std::string> KvStore::get_meta(const std::string& name) const {
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kMetaPrefix + name, &value);
  if (s.IsNotFound()) return std::nullopt;
  check(s, path_, "reading metadata '" + name + "'");
  return value;
}

void KvStore::put_meta(const std::string& name, const std::string& value) {
  check(db_->Put(rocksdb::WriteOptions(), kMetaPrefix + name, value), path_,
        "writing metadata '" + name + "'");
}

std::shared_ptr<const KvStore::View> KvStore::view() const {
  return std::make_shared<const View>(db_.get(), db_->GetSnapshot());
}

std::string KvStore::describe_key(uint32_t table, int64_t row) const {
  return "table " + std::to_string(table) + " row " + std::to_string(row);
}

}  // namespace mt::runtime::sparse
