// Kv-backed embedding tables (issue 30): a synthetic Criteo embedding step with the tables in
// RocksDB behind a row cache of a tenth of their rows, against the same tables in memory.
//
// The workload: 26 features of the synthetic Criteo generator (data/recsys/synthetic.h,
// power-law ids), one table per feature (criteo_table_sizes(--max-rows), dim --dim), table_wise on
// one rank, fused rowwise Adagrad. A step = forward of a batch, loss = sum(out * G) with a fixed
// random G, backward (the touched rows are updated inside backward). The dense part of DLRM is
// left out: it is the same in every configuration.
//
// Configurations, each its own collection trained on the same batches:
//   memory         the tables in memory
//   kv lru         kv tables, cache = --cache-fraction of each table's rows, LRU, no prefetch
//   kv lru + pf    the same with prefetch(next batch) after forward, before backward (as the
//                  trainer does)
//   kv lfu + pf    LFU cache, prefetch
//   kv lru + pf, tensor cache
//                  kv lru + pf with the cache's rows in a tensor (the layout a GPU keeps in
//                  device memory: hits gathered by index, misses copied in; KvSettings::
//                  tensor_cache), here on the CPU
// By default every kv store is first filled with all of its table's rows (their initial values,
// copied from the memory configuration's freshly initialised tables: what an in-memory table
// holds there), so the store holds the whole table and the cache a tenth of it, as in a run
// resumed from a checkpoint; --no-prefill leaves the stores empty (first touches are then
// initialised, not read).
//
// Measurement: --warmup steps (untimed; the caches fill), then --rounds rounds; in each round every
// configuration (rotating order) runs one untimed lead step and then --steps/--rounds timed steps,
// back to back with nothing in between (so a prefetch gets only the time the step gives it; the
// lead step absorbs the prefetch that had the other configurations' turn to finish). The batches
// of a round are generated before it (untimed) and shared by every configuration.
// Correctness: every untimed step's pooled output of each kv configuration must equal the memory
// configuration's bitwise (the first --check-steps warmup steps compared byte by byte, the others
// by a 64-bit hash of the bytes), and a final step after the last round is compared byte by byte;
// the bench aborts on the first difference.
// Ideal hit rate, two ways, over the working sets (the unique rows a step touches: what KvStats
// counts), with C = each table's actual cache capacity (whole sets of 16):
//   expected  the best static cache holds the C most probable ids of the generator's power law;
//             its expected share of a step's working set, computed from the distribution
//             (power_law_ideal below)
//   oracle    the C rows touched in the most measured steps, counted after the fact
// Timings per configuration: steps/s per round (median reported), the mean forward / prefetch
// call / backward time of a timed step, the process's CPU time (every thread), and the KvStats and
// KvStore byte counters over the timed steps. KvStats::prefetch_seconds sums each table's
// background read (the tables run one after another on the store's read thread).
// Defaults fit a 2-core machine in about two minutes (peak RSS about 650 MB).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <time.h>

#include "data/recsys/synthetic.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "parallel/embedding/sharding_plan.h"
#include "runtime/core/rng.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"

using namespace mt;
using runtime::Tensor;
using runtime::sparse::CachePolicy;
using runtime::sparse::KvStats;
using runtime::sparse::TableStorage;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of the whole process (every thread: the training thread, OpenMP's, the prefetch
// threads, RocksDB's background flushes and compactions).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// CPU seconds of the calling thread.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The synthetic generator's id distribution (data/recsys/synthetic.cpp, power_law_id): id rank k
// of a table of n rows has P = ((k + 2)^a - (k + 1)^a) / ((n + 1)^a - 1), a = 1 - s (s = 1: the
// logs). A step of m lookups touches it with q = 1 - (1 - P)^m. Under these independent draws the
// best cache of C rows holds the C most probable ids, and its expected share of a step's working
// set is sum_{k<C} q / sum_k q. Returns {sum_{k<C} q, sum_k q}.
std::pair<double, double> power_law_ideal(int64_t n, double s, int64_t m, int64_t C) {
  const double a = 1.0 - s, top = double(n) + 1.0;
  const bool log_form = std::abs(a) < 1e-9;
  const double denom = log_form ? std::log(top) : std::pow(top, a) - 1.0;
  auto F = [&](double x) { return log_form ? std::log(x) : std::pow(x, a); };
  double hit = 0, all = 0;
  double f_lo = F(1.0);
  for (int64_t k = 0; k < n; ++k) {
    const double f_hi = F(double(k) + 2.0);
    const double p = (f_hi - f_lo) / denom;
    f_lo = f_hi;
    const double q = -std::expm1(double(m) * std::log1p(-std::min(p, 1.0 - 1e-300)));
    all += q;
    if (k < C) hit += q;
  }
  return {hit, all};
}

struct Args {
  int64_t max_rows = 1000000;
  int64_t dim = 16;
  int64_t batch = 2048;
  int64_t pooling = 1;
  int64_t warmup = 300;
  int64_t steps = 300;  // measured, over all rounds
  int64_t rounds = 6;
  int64_t check_steps = 5;
  double cache_fraction = 0.1;
  bool prefill = true;
  std::string kv_dir = "/tmp/mt_kv_tables_bench";
  uint64_t seed = 0;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--max-rows N] [--dim D] [--batch B] [--pooling P] [--warmup W]\n"
               "          [--steps S] [--rounds R] [--check-steps K] [--cache-fraction F]\n"
               "          [--no-prefill] [--kv-dir PATH] [--seed S]\n",
               argv0);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (f == "--max-rows") a.max_rows = std::atoll(value());
    else if (f == "--dim") a.dim = std::atoll(value());
    else if (f == "--batch") a.batch = std::atoll(value());
    else if (f == "--pooling") a.pooling = std::atoll(value());
    else if (f == "--warmup") a.warmup = std::atoll(value());
    else if (f == "--steps") a.steps = std::atoll(value());
    else if (f == "--rounds") a.rounds = std::atoll(value());
    else if (f == "--check-steps") a.check_steps = std::atoll(value());
    else if (f == "--cache-fraction") a.cache_fraction = std::atof(value());
    else if (f == "--no-prefill") a.prefill = false;
    else if (f == "--kv-dir") a.kv_dir = value();
    else if (f == "--seed") a.seed = uint64_t(std::atoll(value()));
    else usage(argv[0]);
  }
  if (a.max_rows < 4 || a.dim < 1 || a.batch < 1 || a.pooling < 1 || a.warmup < 0 ||
      a.rounds < 1 || a.steps < a.rounds || a.cache_fraction <= 0 || a.cache_fraction > 1)
    usage(argv[0]);
  return a;
}

// What KvTable's cache holds for a table of `rows` rows (KvCacheSize, then RowCache's rounding).
int64_t cache_capacity(int64_t rows, double fraction) {
  runtime::sparse::KvCacheSize size;
  size.fraction = fraction;
  const int64_t c = size.rows_for(rows);
  const int64_t ways = std::min<int64_t>(16, c);
  return (c + ways - 1) / ways * ways;
}

uint64_t hash_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = size_t(c.numel()) * runtime::dtype_size(c.dtype());
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 8 bytes at a time
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Config {
  std::string name;
  TableStorage storage = TableStorage::Memory;
  CachePolicy policy = CachePolicy::LRU;
  bool prefetch = false;
  bool tensor_cache = false;
  std::unique_ptr<parallel::ShardedEmbeddingBagCollection> ebc;
  runtime::sparse::KvStore* store = nullptr;
  // Measured window (summed over rounds).
  std::vector<double> round_seconds;
  double cpu_seconds = 0;
  // Phases of the timed steps (training thread): forward (gather included), the prefetch call,
  // backward (the row update and the cache write-back included).
  double forward_seconds = 0, prefetch_call_seconds = 0, backward_seconds = 0;
  double prefetch_call_cpu_seconds = 0;  // the training thread's CPU time in the prefetch call
  bool timing = false;
  KvStats window;  // deltas
  uint64_t store_bytes_read = 0, store_bytes_written = 0;
  bool is_kv() const { return storage == TableStorage::Kv; }
};

void add_delta(KvStats& acc, const KvStats& after, const KvStats& before) {
  acc += after - before;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string human_bytes(double b) {
  char buf[64];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else if (b >= 1e3) std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

uint64_t dir_bytes(const fs::path& p) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

[[noreturn]] void mismatch(const std::string& cfg, const std::string& what, int64_t step) {
  std::fprintf(stderr,
               "kv_tables_bench: FAILED: %s's pooled output differs from the memory tables' at "
               "step %" PRId64 " (%s); the measurements would be of a wrong computation\n",
               cfg.c_str(), step, what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::shared_ptr<parallel::ProcessGroup> world(parallel::MpiProcessGroup::world());
  MT_CHECK(world->size() == 1, "kv_tables_bench runs on one rank");

  // --- Data and tables.
  data::recsys::SyntheticOptions so;
  so.table_sizes = data::recsys::criteo_table_sizes(args.max_rows);
  so.pooling_factor = args.pooling;
  so.local_batch_size = args.batch;
  so.seed = args.seed;
  data::recsys::SyntheticCriteo gen(so);
  const std::vector<int64_t>& sizes = gen.table_sizes();
  const size_t T = sizes.size();

  std::vector<parallel::EmbeddingBagConfig> tables;
  int64_t total_rows = 0, total_cache = 0;
  for (size_t t = 0; t < T; ++t) {
    parallel::EmbeddingBagConfig c;
    c.name = "t" + std::to_string(t);
    c.num_embeddings = sizes[t];
    c.embedding_dim = args.dim;
    c.feature_names = {gen.sparse_feature_names()[t]};
    c.optimizer.type = runtime::sparse::EmbOptimType::RowwiseAdagrad;
    c.optimizer.lr = 0.05;
    tables.push_back(c);
    total_rows += sizes[t];
    total_cache += cache_capacity(sizes[t], args.cache_fraction);
  }
  parallel::ShardingPlan plan;
  plan.world_size = 1;
  plan.local_size = 1;
  for (const auto& t : tables) plan.tables[t.name] = parallel::table_wise_sharding(t, 0);

  std::vector<Config> configs(5);
  configs[0].name = "memory";
  configs[1].name = "kv lru";
  configs[2].name = "kv lru + prefetch";
  configs[3].name = "kv lfu + prefetch";
  configs[4].name = "kv lru + prefetch, tensor cache";
  for (size_t i = 1; i < configs.size(); ++i) configs[i].storage = TableStorage::Kv;
  configs[2].prefetch = configs[3].prefetch = configs[4].prefetch = true;
  configs[3].policy = CachePolicy::LFU;
  configs[4].tensor_cache = true;

  // Row bytes in the store: dim f32 + rowwise Adagrad's one f32.
  const int64_t row_bytes = (args.dim + 1) * 4;
  std::printf("kv_tables_bench: %zu tables, %" PRId64 " rows in all (largest %" PRId64
              "), dim %" PRId64 ", %" PRId64 " B per stored row (weight + rowwise Adagrad state)\n",
              T, total_rows, sizes[0], args.dim, row_bytes);
  std::printf("  table rows:");
  for (int64_t s : sizes) std::printf(" %" PRId64, s);
  std::printf("\n  cache: %.3g of each table's rows (rounded up to sets of 16): %" PRId64
              " rows in all = 1/%.1f of the tables; batch %" PRId64 ", pooling %" PRId64
              " (%" PRId64 " ids per step)\n",
              args.cache_fraction, total_cache, double(total_rows) / double(total_cache),
              args.batch, args.pooling, args.batch * args.pooling * int64_t(T));
  std::fflush(stdout);

  // Each kv configuration's store: <kv-dir>/config<i>/rank-0 (KvStore::open_scratch wipes an old
  // minititan store there and refuses a folder holding anything else).
  for (size_t i = 0; i < configs.size(); ++i) {
    Config& c = configs[i];
    std::vector<parallel::EmbeddingBagConfig> tc = tables;
    for (auto& t : tc) {
      t.storage = c.storage;
      t.kv_cache.fraction = args.cache_fraction;
    }
    runtime::sparse::CollectionOptions o;
    o.kv.path = (fs::path(args.kv_dir) / ("config" + std::to_string(i))).string();
    o.kv.policy = c.policy;
    o.kv.tensor_cache = c.tensor_cache;
    c.ebc = std::make_unique<parallel::ShardedEmbeddingBagCollection>(tc, plan, world, nullptr, o);
    c.ebc->init_weights(args.seed + 1);
    c.ebc->train();
  }

  // --- Prefill the stores with every row (initial values: the memory tables', not yet trained).
  if (args.prefill) {
    const auto t0 = Clock::now();
    const auto mem_shards = configs[0].ebc->local_shards();
    for (size_t i = 1; i < configs.size(); ++i) {
      for (const parallel::LocalShard& s : configs[i].ebc->local_shards()) {
        MT_CHECK(s.kv != nullptr, "config ", configs[i].name, ": table ", s.table, " is not kv");
        const parallel::LocalShard* m = nullptr;
        for (const auto& ms : mem_shards)
          if (ms.table == s.table) m = &ms;
        MT_CHECK(m != nullptr && m->weight.defined(), "no memory shard for ", s.table);
        const int64_t rows = s.kv->local_rows(), cols = s.kv->local_cols();
        // The kv table's own initial values must be the memory table's (a sample of rows).
        {
          const int64_t n = std::min<int64_t>(rows, 1024);
          Tensor w = runtime::empty({n, cols});
          std::vector<Tensor> st;
          for (const auto& [f, width] : s.kv->state_fields()) st.push_back(runtime::empty({n, width}));
          s.kv->read_rows(0, n, w, st, nullptr);
          const Tensor mw = m->weight.narrow(0, 0, n).contiguous();
          if (std::memcmp(w.data_ptr(), mw.data_ptr(), size_t(n * cols) * 4) != 0) {
            std::fprintf(stderr, "kv_tables_bench: FAILED: table %s's kv initial rows differ from "
                         "the memory table's\n", s.table.c_str());
            return 1;
          }
        }
        for (int64_t first = 0; first < rows; first += 65536) {
          const int64_t n = std::min<int64_t>(65536, rows - first);
          std::vector<Tensor> st;
          for (const auto& [f, width] : s.kv->state_fields()) st.push_back(runtime::zeros({n, width}));
          s.kv->write_rows(first, m->weight.narrow(0, first, n).contiguous(), st);
        }
      }
    }
    std::printf("  prefill: %" PRId64 " rows written to each of %zu stores in %.1f s\n",
                total_rows, configs.size() - 1, seconds_since(t0));
  }
  for (Config& c : configs)
    if (c.is_kv())
      for (const parallel::LocalShard& s : c.ebc->local_shards())
        if (s.kv) c.store = &s.kv->store();

  // The fixed upstream gradient G.
  const int64_t out_cols = int64_t(T) * args.dim;
  std::vector<float> g(size_t(args.batch * out_cols));
  {
    const runtime::RandomKey key(args.seed, "kv_tables_bench.G");
    for (size_t i = 0; i < g.size(); ++i) g[i] = float(runtime::normal_at(key, uint64_t(i)));
  }
  const Tensor G = runtime::from_vector<float>(g, {args.batch, out_cols});

  // One step; returns the pooled output.
  auto step = [&](Config& c, const data::recsys::RecsysBatch& b,
                  const data::recsys::RecsysBatch* next) -> Tensor {
    const auto t0 = Clock::now();
    const runtime::sparse::KeyedTensor out = (*c.ebc)(b.sparse);
    const auto t1 = Clock::now();
    const double cpu1 = c.timing ? thread_cpu_seconds() : 0.0;
    if (c.prefetch && next) c.ebc->prefetch(next->sparse);
    if (c.timing) c.prefetch_call_cpu_seconds += thread_cpu_seconds() - cpu1;
    const auto t2 = Clock::now();
    runtime::sum(runtime::mul(out.values, G)).backward();
    if (c.timing) {
      const auto t3 = Clock::now();
      c.forward_seconds += std::chrono::duration<double>(t1 - t0).count();
      c.prefetch_call_seconds += std::chrono::duration<double>(t2 - t1).count();
      c.backward_seconds += std::chrono::duration<double>(t3 - t2).count();
    }
    return out.values.detach();
  };

  // Batches are generated per segment; the one after a segment is kept as its lookahead.
  std::vector<data::recsys::RecsysBatch> batches;
  data::recsys::RecsysBatch lookahead = gen.next();
  auto make_segment = [&](int64_t n) {
    batches.clear();
    batches.push_back(std::move(lookahead));
    for (int64_t i = 1; i < n; ++i) batches.push_back(gen.next());
    lookahead = gen.next();
  };
  auto next_of = [&](size_t i) { return i + 1 < batches.size() ? &batches[i + 1] : &lookahead; };

  // --- Warmup (untimed), with the bitwise checks.
  int64_t global_step = 0;
  std::vector<std::vector<bool>> seen(T);
  for (size_t t = 0; t < T; ++t) seen[t].assign(size_t(sizes[t]), false);
  std::vector<int64_t> distinct(T, 0);
  auto note_seen = [&](const data::recsys::RecsysBatch& b) {
    const std::vector<int64_t> off = b.sparse.offset_per_key();
    const Tensor v = b.sparse.values().contiguous();
    const int64_t* ids = v.data<int64_t>();
    for (size_t t = 0; t < T; ++t)
      for (int64_t k = off[t]; k < off[t + 1]; ++k)
        if (!seen[t][size_t(ids[k])]) {
          seen[t][size_t(ids[k])] = true;
          ++distinct[t];
        }
  };
  {
    const auto t0 = Clock::now();
    const int64_t chunk = 25;
    for (int64_t done = 0; done < args.warmup; done += chunk) {
      const int64_t n = std::min(chunk, args.warmup - done);
      make_segment(n);
      for (const auto& b : batches) note_seen(b);
      std::vector<uint64_t> ref_hash(static_cast<size_t>(n));
      std::vector<std::vector<unsigned char>> ref_bytes(static_cast<size_t>(n));
      for (size_t ci = 0; ci < configs.size(); ++ci) {
        for (int64_t i = 0; i < n; ++i) {
          const Tensor out = step(configs[ci], batches[size_t(i)], next_of(size_t(i)));
          const int64_t s = global_step + i;
          const uint64_t h = hash_bytes(out);
          const bool full = s < args.check_steps;
          if (ci == 0) {
            ref_hash[size_t(i)] = h;
            if (full) {
              const auto* p = static_cast<const unsigned char*>(out.contiguous().data_ptr());
              ref_bytes[size_t(i)].assign(p, p + out.numel() * 4);
            }
            continue;
          }
          if (full) {
            const Tensor oc = out.contiguous();
            if (size_t(oc.numel() * 4) != ref_bytes[size_t(i)].size() ||
                std::memcmp(oc.data_ptr(), ref_bytes[size_t(i)].data(),
                            ref_bytes[size_t(i)].size()) != 0)
              mismatch(configs[ci].name, "byte by byte", s);
          }
          if (h != ref_hash[size_t(i)]) mismatch(configs[ci].name, "hash", s);
        }
      }
      global_step += n;
    }
    std::printf("  warmup: %" PRId64 " steps per configuration in %.1f s (outputs of every kv "
                "configuration bitwise equal to the memory tables')\n",
                args.warmup, seconds_since(t0));
    int64_t filled = 0;
    for (size_t t = 0; t < T; ++t)
      filled += distinct[t] >= cache_capacity(sizes[t], args.cache_fraction);
    std::printf("  after warmup: %" PRId64 " of %zu tables have seen more distinct rows than their "
                "cache holds (largest table: %" PRId64 " distinct rows seen, cache %" PRId64
                ")\n",
                filled, T, distinct[0], cache_capacity(sizes[0], args.cache_fraction));
    std::fflush(stdout);
  }

  // --- Measured rounds.
  const int64_t per_round = args.steps / args.rounds;
  std::vector<std::vector<int32_t>> step_count(T), last_seen(T);
  for (size_t t = 0; t < T; ++t) {
    step_count[t].assign(size_t(sizes[t]), 0);
    last_seen[t].assign(size_t(sizes[t]), -1);
  }
  int64_t measured_step = 0;
  for (int64_t r = 0; r < args.rounds; ++r) {
    make_segment(1 + per_round);  // the lead step, then the timed ones
    // Working sets of the timed steps, for the ideal.
    for (int64_t i = 1; i <= per_round; ++i, ++measured_step) {
      const auto& kjt = batches[size_t(i)].sparse;
      const std::vector<int64_t> off = kjt.offset_per_key();
      const int64_t* v = kjt.values().contiguous().data<int64_t>();
      for (size_t t = 0; t < T; ++t)
        for (int64_t k = off[t]; k < off[t + 1]; ++k) {
          const size_t id = size_t(v[k]);
          if (last_seen[t][id] != measured_step) {
            last_seen[t][id] = int32_t(measured_step);
            ++step_count[t][id];
          }
        }
    }
    uint64_t ref_lead = 0;
    std::vector<uint64_t> lead(configs.size());
    for (size_t k = 0; k < configs.size(); ++k) {
      const size_t ci = (size_t(r) + k) % configs.size();  // rotating order
      Config& c = configs[ci];
      lead[ci] = hash_bytes(step(c, batches[0], next_of(0)));
      const KvStats before = c.is_kv() ? c.ebc->kv_stats() : KvStats{};
      const uint64_t br = c.store ? c.store->bytes_read() : 0;
      const uint64_t bw = c.store ? c.store->bytes_written() : 0;
      const double cpu0 = process_cpu_seconds();
      c.timing = true;
      const auto t0 = Clock::now();
      for (int64_t i = 1; i <= per_round; ++i) step(c, batches[size_t(i)], next_of(size_t(i)));
      c.round_seconds.push_back(seconds_since(t0));
      c.timing = false;
      c.cpu_seconds += process_cpu_seconds() - cpu0;
      if (c.is_kv()) {
        add_delta(c.window, c.ebc->kv_stats(), before);
        c.store_bytes_read += c.store->bytes_read() - br;
        c.store_bytes_written += c.store->bytes_written() - bw;
      }
    }
    ref_lead = lead[0];
    for (size_t ci = 1; ci < configs.size(); ++ci)
      if (lead[ci] != ref_lead) mismatch(configs[ci].name, "hash", global_step);
    global_step += 1 + per_round;
    std::printf("  round %" PRId64 ":", r + 1);
    for (const Config& c : configs)
      std::printf("  %s %.2f steps/s", c.name.c_str(), double(per_round) / c.round_seconds.back());
    std::printf("\n");
    std::fflush(stdout);
  }

  // --- A final step, compared byte by byte.
  {
    make_segment(1);
    std::vector<unsigned char> ref;
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const Tensor out = step(configs[ci], batches[0], nullptr).contiguous();
      const auto* p = static_cast<const unsigned char*>(out.data_ptr());
      if (ci == 0) ref.assign(p, p + out.numel() * 4);
      else if (std::memcmp(p, ref.data(), ref.size()) != 0)
        mismatch(configs[ci].name, "byte by byte, after the measured rounds", global_step);
    }
    ++global_step;
  }

  // --- The ideal static cache over the measured steps.
  int64_t ws_total = 0, ideal_hits = 0;
  for (size_t t = 0; t < T; ++t) {
    std::vector<int32_t> c = step_count[t];
    const int64_t cap = std::min<int64_t>(cache_capacity(sizes[t], args.cache_fraction),
                                          int64_t(c.size()));
    for (int32_t x : c) ws_total += x;
    std::nth_element(c.begin(), c.begin() + (cap - 1), c.end(), std::greater<int32_t>());
    for (int64_t i = 0; i < cap; ++i) ideal_hits += c[size_t(i)];
  }
  const double ideal = double(ideal_hits) / double(ws_total);
  double expect_hit = 0, expect_all = 0;
  for (size_t t = 0; t < T; ++t) {
    const auto [h, a] = power_law_ideal(sizes[t], so.zipf_exponent, args.batch * args.pooling,
                                   cache_capacity(sizes[t], args.cache_fraction));
    expect_hit += h;
    expect_all += a;
  }
  const double ideal_model = expect_hit / expect_all;
  const double S = double(per_round * args.rounds);

  // --- Report.
  std::printf("\nmeasured: %" PRId64 " rounds x %" PRId64 " timed steps per configuration, after "
              "%" PRId64 " warmup steps; working-set rows per step %.0f\n",
              args.rounds, per_round, args.warmup, double(ws_total) / S);
  const double mem_sps = double(per_round) / median(configs[0].round_seconds);
  std::printf("\n| configuration | steps/s (median of %" PRId64 " rounds) | ms / step | vs memory "
              "| forward ms | prefetch call ms (its CPU) | backward ms | process CPU ms / step |\n"
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
              args.rounds);
  for (const Config& c : configs) {
    const double sps = double(per_round) / median(c.round_seconds);
    std::printf("| %s | %.2f | %.2f | %.2fx | %.2f | %.2f (%.2f) | %.2f | %.1f |\n", c.name.c_str(),
                sps, 1e3 / sps, sps / mem_sps, 1e3 * c.forward_seconds / S,
                1e3 * c.prefetch_call_seconds / S, 1e3 * c.prefetch_call_cpu_seconds / S,
                1e3 * c.backward_seconds / S, 1e3 * c.cpu_seconds / S);
  }
  auto rate = [&](const Config& c, bool with_prefetch) {
    const KvStats& w = c.window;
    return 100.0 * double(w.cache_hits + (with_prefetch ? w.prefetch_hits : 0)) /
           double(w.rows_requested);
  };
  std::printf("\n| hit rate (share of the steps' working-set rows) | %% |\n| --- | ---: |\n");
  std::printf("| ideal static cache, expected under the generator's power law (top-C ids by "
              "probability) | %.2f |\n",
              100.0 * ideal_model);
  std::printf("| ideal static cache, oracle over the measured steps (top-C rows by steps touched) "
              "| %.2f |\n",
              100.0 * ideal);
  std::printf("| LRU cache (measured) | %.2f |\n", rate(configs[1], false));
  std::printf("| LFU cache (measured) | %.2f |\n", rate(configs[3], false));
  std::printf("| LRU cache + prefetch (found in the cache or read ahead) | %.2f |\n",
              rate(configs[2], true));
  std::printf("| LFU cache + prefetch (found in the cache or read ahead) | %.2f |\n",
              rate(configs[3], true));

  std::printf("\n| per step |");
  for (size_t i = 1; i < configs.size(); ++i) std::printf(" %s |", configs[i].name.c_str());
  std::printf("\n| --- |");
  for (size_t i = 1; i < configs.size(); ++i) std::printf(" ---: |");
  std::printf("\n");
  auto row = [&](const char* what, auto&& fn) {
    std::printf("| %s |", what);
    for (size_t i = 1; i < configs.size(); ++i) std::printf(" %s |", fn(configs[i]).c_str());
    std::printf("\n");
  };
  auto num = [](double v, const char* fmt) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  row("working-set rows (unique rows the step touches)",
      [&](const Config& c) { return num(double(c.window.rows_requested) / S, "%.0f"); });
  row("rows read from RocksDB on the training thread (in gather)",
      [&](const Config& c) { return num(double(c.window.store_reads) / S, "%.0f"); });
  row("rows read ahead by prefetch (background)", [&](const Config& c) {
    return num(double(c.store_bytes_read - c.window.bytes_read) / double(row_bytes) / S, "%.0f");
  });
  row("rows written to RocksDB (evictions)",
      [&](const Config& c) { return num(double(c.window.rows_written) / S, "%.0f"); });
  row("rows initialised (never stored)",
      [&](const Config& c) { return num(double(c.window.initialised) / S, "%.1f"); });
  row("bytes read from RocksDB (KvStore::bytes_read)",
      [&](const Config& c) { return human_bytes(double(c.store_bytes_read) / S); });
  row("bytes written to RocksDB (KvStore::bytes_written)",
      [&](const Config& c) { return human_bytes(double(c.store_bytes_written) / S); });
  row("gather ms (training thread: cache, prefetch wait, reads)",
      [&](const Config& c) { return num(1e3 * c.window.gather_seconds / S, "%.2f"); });
  row("prefetch store ms (background: the read thread's time for the 26 tables)",
      [&](const Config& c) { return num(1e3 * c.window.prefetch_seconds / S, "%.2f"); });

  const Config& np = configs[1];
  const Config& pf = configs[2];
  const double np_ms = 1e3 / (double(per_round) / median(np.round_seconds));
  const double pf_ms = 1e3 / (double(per_round) / median(pf.round_seconds));
  std::printf("\nprefetch (LRU): gather on the training thread %.2f -> %.2f ms / step (%.2f ms / "
              "step of store reads moved off it); step %.2f -> %.2f ms (%+.2f ms / step); process "
              "CPU %.1f -> %.1f ms / step\n",
              1e3 * np.window.gather_seconds / S, 1e3 * pf.window.gather_seconds / S,
              1e3 * (np.window.gather_seconds - pf.window.gather_seconds) / S, np_ms, pf_ms,
              pf_ms - np_ms, 1e3 * np.cpu_seconds / S, 1e3 * pf.cpu_seconds / S);
  std::printf("expected working-set rows per step under the power law: %.0f (measured %.0f)\n",
              expect_all, double(ws_total) / S);
  for (size_t i = 1; i < configs.size(); ++i)
    std::printf("store %s: %s on disk\n", configs[i].name.c_str(),
                human_bytes(double(dir_bytes(fs::path(args.kv_dir) / ("config" + std::to_string(i)))))
                    .c_str());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak resident memory of the process: %.0f MB (memory tables, 3 caches, RocksDB "
              "memtables and block caches, the round's batches)\n",
              double(ru.ru_maxrss) / 1024.0);
  std::printf("every kv configuration's pooled outputs bitwise equal to the memory tables' (%" PRId64
              " untimed steps checked: warmup, each round's lead step, a final step)\n",
              args.warmup + args.rounds + 1);
  configs.clear();
  // Only what the bench made: the stores, then the folders above them if that left them empty.
  std::error_code ec;
  for (size_t i = 1; i < 4; ++i) {
    const fs::path dir = fs::path(args.kv_dir) / ("config" + std::to_string(i));
    fs::remove_all(dir / "rank-0", ec);
    fs::remove(dir, ec);
  }
  fs::remove(args.kv_dir, ec);
  return 0;
}
