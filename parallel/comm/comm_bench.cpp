// The collectives benchmark: buffers with known values, timed calls, checks, raw MPI beside.
#include "parallel/comm/comm_bench.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "parallel/comm/comm_trace.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"

namespace mt::parallel {

namespace {

using runtime::DType;
using runtime::Tensor;
using Clock = std::chrono::steady_clock;

// The values every buffer is filled with are small integers: exact in bf16 and in any sum here.
// Buffers live on the group's device (CommBenchOptions::device).
Tensor filled(const std::vector<float>& values, const CommBenchOptions& o) {
  return runtime::from_vector<float>(values, {int64_t(values.size())}).to(o.dtype).to(o.device);
}

Tensor empty_buffer(int64_t count, const CommBenchOptions& o) {
  return runtime::empty({count},
                        runtime::TensorOptions{}.with_dtype(o.dtype).with_device(o.device));
}

int64_t count_errors(const Tensor& got, const std::vector<float>& want) {
  const std::vector<float> g =
      got.to(runtime::Device::cpu()).to(DType::F32).contiguous().to_vector<float>();
  int64_t errors = 0;
  for (size_t i = 0; i < want.size(); ++i) errors += g[i] != want[i];
  return errors;
}

// One collective at one size on this rank: prepare() makes the buffers, run() issues the call
// (ours), raw() the blocking MPI call (null when there is none), check() counts wrong elements.
struct Case {
  std::function<void()> run, raw;
  std::function<void()> reset, raw_reset;  // before each call, untimed: fresh in-place buffers
  std::function<int64_t()> check;
  int64_t bytes = 0, count = 0;
  std::vector<int64_t> send_bytes, recv_bytes;  // all_to_all: per peer
};

// Rows rank `from` sends rank `to` in a skewed all_to_all with `base` rows per peer.
int64_t skewed_rows(int64_t base, double skew, int64_t from, int64_t to, int64_t n) {
  const double w = 1.0 + skew * double((from + 2 * to) % n) / double(std::max<int64_t>(1, n - 1));
  return int64_t(std::llround(double(base) * w));
}

// Rows rank `from` sends rank `to` in an all_to_all with `base` rows per peer on average: the
// recorded weights, the skew, or even.
int64_t all_to_all_rows(const CommBenchOptions& o, int64_t base, int64_t from, int64_t to,
                        int64_t n) {
  if (!o.all_to_all_weights.empty()) {
    double mean_total = 0;
    for (const auto& row : o.all_to_all_weights)
      for (double w : row) mean_total += w / double(n);
    return std::llround(double(base * n) * o.all_to_all_weights[size_t(from)][size_t(to)] /
                        std::max(mean_total, 1e-30));
  }
  return o.skew > 0 ? skewed_rows(base, o.skew, from, to, n) : base;
}

bool uneven_all_to_all(const CommBenchOptions& o) {
  return o.skew > 0 || !o.all_to_all_weights.empty();
}

Case make_case(ProcessGroup& group, MPI_Comm comm, CollectiveKind kind, int64_t size_bytes,
               const CommBenchOptions& o) {
  const int64_t n = group.size(), r = group.rank();
  const int64_t esize = int64_t(runtime::dtype_size(o.dtype));
  const bool raw_ok = comm != MPI_COMM_NULL && o.dtype == DType::F32;
  Case c;
  switch (kind) {
    case CollectiveKind::AllReduce: {
      const int64_t count = std::max<int64_t>(1, size_bytes / esize);
      std::vector<float> in(static_cast<size_t>(count)), want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        in[size_t(i)] = float((r + 1) * (i % 7 + 1));
        want[size_t(i)] = float(n * (n + 1) / 2 * (i % 7 + 1));
      }
      auto buf = std::make_shared<Tensor>(empty_buffer(count, o));
      const Tensor src = filled(in, o);
      c.reset = [buf, src] { buf->copy_(src); };  // the same buffer every call, as MPI's
      c.run = [&group, buf] { group.all_reduce(*buf, ReduceOp::Sum, "comm_bench.all_reduce"); };
      if (raw_ok) {
        auto raw = std::make_shared<std::vector<float>>(in);
        c.raw_reset = [raw, in] { std::copy(in.begin(), in.end(), raw->begin()); };
        c.raw = [comm, raw] {
          MPI_Allreduce(MPI_IN_PLACE, raw->data(), int(raw->size()), MPI_FLOAT, MPI_SUM, comm);
        };
      }
      c.check = [buf, want] { return count_errors(*buf, want); };
      c.count = count;
      break;
    }
    case CollectiveKind::AllGather: {
      const int64_t each = std::max<int64_t>(1, size_bytes / esize / n), count = each * n;
      std::vector<float> in(static_cast<size_t>(each)), want(static_cast<size_t>(count));
      for (int64_t i = 0; i < each; ++i) in[size_t(i)] = float(r + 1 + i % 5);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < each; ++i) want[size_t(j * each + i)] = float(j + 1 + i % 5);
      const Tensor src = filled(in, o);
      auto out = std::make_shared<Tensor>(runtime::empty({count}, src.options()));
      c.run = [&group, out, src] { group.all_gather_into(*out, src, "comm_bench.all_gather"); };
      if (raw_ok) {
        auto raw = std::make_shared<std::vector<float>>(static_cast<size_t>(count));
        c.raw = [comm, raw, in] {
          MPI_Allgather(in.data(), int(in.size()), MPI_FLOAT, raw->data(), int(in.size()),
                        MPI_FLOAT, comm);
        };
      }
      c.check = [out, want] { return count_errors(*out, want); };
      c.count = count;
      break;
    }
    case CollectiveKind::ReduceScatter: {
      const int64_t each = std::max<int64_t>(1, size_bytes / esize / n), count = each * n;
      std::vector<float> in(static_cast<size_t>(count)), want(static_cast<size_t>(each));
      for (int64_t i = 0; i < count; ++i) in[size_t(i)] = float((r + 1) * (i % 7 + 1));
      for (int64_t i = 0; i < each; ++i)
        want[size_t(i)] = float(n * (n + 1) / 2 * ((r * each + i) % 7 + 1));
      const Tensor src = filled(in, o);
      auto out = std::make_shared<Tensor>(runtime::empty({each}, src.options()));
      c.run = [&group, out, src] {
        group.reduce_scatter_into(*out, src, ReduceOp::Sum, "comm_bench.reduce_scatter");
      };
      if (raw_ok) {
        auto raw = std::make_shared<std::vector<float>>(static_cast<size_t>(each));
        c.raw = [comm, raw, in] {
          MPI_Reduce_scatter_block(in.data(), raw->data(), int(raw->size()), MPI_FLOAT, MPI_SUM,
                                   comm);
        };
      }
      c.check = [out, want] { return count_errors(*out, want); };
      c.count = count;
      break;
    }
    case CollectiveKind::AllToAll: {
      const int64_t base = std::max<int64_t>(1, size_bytes / esize / n);
      std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        send[size_t(j)] = all_to_all_rows(o, base, r, j, n);
        recv[size_t(j)] = all_to_all_rows(o, base, j, r, n);
      }
      std::vector<float> in, want;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < send[size_t(j)]; ++i) in.push_back(float(r + 1 + j % 3 + i % 2));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < recv[size_t(j)]; ++i) want.push_back(float(j + 1 + r % 3 + i % 2));
      const Tensor src = filled(in, o);
      auto out = std::make_shared<Tensor>(runtime::empty({int64_t(want.size())}, src.options()));
      const bool uneven = uneven_all_to_all(o);
      const std::vector<int64_t> s = uneven ? send : std::vector<int64_t>{};
      const std::vector<int64_t> v = uneven ? recv : std::vector<int64_t>{};
      c.run = [&group, out, src, s, v] {
        group.all_to_all_single(*out, src, v, s, "comm_bench.all_to_all");
      };
      if (raw_ok && !uneven) {
        auto raw = std::make_shared<std::vector<float>>(want.size());
        c.raw = [comm, raw, in, base] {
          MPI_Alltoall(in.data(), int(base), MPI_FLOAT, raw->data(), int(base), MPI_FLOAT, comm);
        };
      }
      c.check = [out, want] { return count_errors(*out, want); };
      c.count = int64_t(in.size());
      for (int64_t j = 0; j < n; ++j) {
        c.send_bytes.push_back(send[size_t(j)] * esize);
        c.recv_bytes.push_back(recv[size_t(j)] * esize);
      }
      break;
    }
    case CollectiveKind::Broadcast: {
      const int64_t count = std::max<int64_t>(1, size_bytes / esize);
      std::vector<float> in(static_cast<size_t>(count)), want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        want[size_t(i)] = float(i % 9 + 1);
        in[size_t(i)] = r == 0 ? want[size_t(i)] : 0.0f;
      }
      const Tensor src = filled(in, o);
      auto buf = std::make_shared<Tensor>(empty_buffer(count, o));
      c.reset = [buf, src] { buf->copy_(src); };  // the same buffer every call, as MPI's
      c.run = [&group, buf] { group.broadcast(*buf, 0, "comm_bench.broadcast"); };
      if (raw_ok) {
        auto raw = std::make_shared<std::vector<float>>(in);
        c.raw_reset = [raw, in] { std::copy(in.begin(), in.end(), raw->begin()); };
        c.raw = [comm, raw] { MPI_Bcast(raw->data(), int(raw->size()), MPI_FLOAT, 0, comm); };
      }
      c.check = [buf, want] { return count_errors(*buf, want); };
      c.count = count;
      break;
    }
    case CollectiveKind::SendRecv:          // a ring: send to r + 1, receive from r - 1
    case CollectiveKind::PostedSendRecv: {  // the same ring, both messages posted as one batch
      const bool posted = kind == CollectiveKind::PostedSendRecv;
      const int64_t count = std::max<int64_t>(1, size_bytes / esize);
      const int64_t next = (r + 1) % n, prev = (r + n - 1) % n;
      std::vector<float> in(static_cast<size_t>(count)), want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        in[size_t(i)] = float(r + 1 + i % 4);
        want[size_t(i)] = float(prev + 1 + i % 4);
      }
      const Tensor src = filled(in, o);
      auto out = std::make_shared<Tensor>(runtime::empty({count}, src.options()));
      auto raw = std::make_shared<std::vector<float>>(static_cast<size_t>(count));
      if (posted) {
        // batch_isend_irecv: isend and irecv on MPI, one group on NCCL (where a lone posted
        // send would wait for its receive, queued behind it on the same stream).
        c.run = [&group, out, src, next, prev] {
          using Op = ProcessGroup::P2POp;
          const std::vector<Work> works =
              group.batch_isend_irecv({{Op::Kind::Recv, *out, int(prev), 9, "comm_bench.irecv"},
                                       {Op::Kind::Send, src, int(next), 9, "comm_bench.isend"}});
          for (const Work& w : works) w.wait();
        };
        if (raw_ok) {
          c.raw = [comm, raw, in, next, prev] {
            MPI_Request requests[2];
            MPI_Irecv(raw->data(), int(raw->size()), MPI_FLOAT, int(prev), 10, comm,
                      &requests[0]);
            MPI_Isend(in.data(), int(in.size()), MPI_FLOAT, int(next), 10, comm, &requests[1]);
            MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
          };
        }
      } else {
        // Even ranks send first, odd ranks receive first: no rank waits on a peer that waits too
        // (sends may be synchronous).
        c.run = [&group, out, src, next, prev, r] {
          if (r % 2 == 0) group.send(src, int(next), 7, "comm_bench.send");
          group.recv(*out, int(prev), 7, "comm_bench.recv");
          if (r % 2 != 0) group.send(src, int(next), 7, "comm_bench.send");
        };
        if (raw_ok) {
          // The same ordered pair of blocking calls (ProcessGroup has no fused send-receive).
          c.raw = [comm, raw, in, next, prev, r] {
            auto send = [&] {
              MPI_Send(in.data(), int(in.size()), MPI_FLOAT, int(next), 8, comm);
            };
            if (r % 2 == 0) send();
            MPI_Recv(raw->data(), int(raw->size()), MPI_FLOAT, int(prev), 8, comm,
                     MPI_STATUS_IGNORE);
            if (r % 2 != 0) send();
          };
        }
      }
      c.check = [out, want] { return count_errors(*out, want); };
      c.count = count;
      break;
    }
  }
  c.bytes = c.count * esize;
  return c;
}

// Seconds per call of ours and of the raw MPI call (-1 without one), each averaged over `iters`
// timed calls after `warmup` untimed ones. The two alternate call by call, and which goes first
// alternates too, so both see the same machine in the same state; resets and `after` (the check
// of ours) run outside the timing.
struct Times {
  double ours = 0, raw = -1;
};

// A call's time until its result is there: on a GPU the host waits for the device (NCCL calls
// return once queued), as nccl-tests' timing does.
double timed_call(ProcessGroup& group, runtime::Device device, const std::function<void()>& call,
                  const std::function<void()>& reset) {
  if (reset) reset();
  if (!device.is_cpu()) runtime::synchronize(device);
  group.barrier("comm_bench.barrier");
  const auto t0 = Clock::now();
  call();
  if (!device.is_cpu()) runtime::synchronize(device);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Times time_calls(ProcessGroup& group, runtime::Device device, const Case& c, int64_t warmup,
                 int64_t iters, const std::function<void()>& after) {
  Times total{0, c.raw ? 0.0 : -1.0};
  for (int64_t i = 0; i < warmup + iters; ++i) {
    double raw = 0;
    if (c.raw && i % 2 == 1) raw = timed_call(group, device, c.raw, c.raw_reset);
    const double ours = timed_call(group, device, c.run, c.reset);
    if (c.raw && i % 2 == 0) raw = timed_call(group, device, c.raw, c.raw_reset);
    if (i < warmup) continue;
    total.ours += ours;
    if (c.raw) total.raw += raw;
    if (after) after();
  }
  const double n = double(std::max<int64_t>(1, iters));
  return {total.ours / n, c.raw ? total.raw / n : -1.0};
}

// {min, sum, max} of a value over the group (whose tensors live on `device`).
std::vector<double> min_sum_max(ProcessGroup& group, runtime::Device device, double v) {
  Tensor t = runtime::from_vector<double>({-v, v, v}, {3}, {DType::F64}).to(device);
  Tensor neg = t.narrow(0, 0, 1).clone(), sum = t.narrow(0, 1, 1).clone(),
         max = t.narrow(0, 2, 1).clone();
  group.all_reduce(neg, ReduceOp::Max, "comm_bench.stats");
  group.all_reduce(sum, ReduceOp::Sum, "comm_bench.stats");
  group.all_reduce(max, ReduceOp::Max, "comm_bench.stats");
  const auto value = [](const Tensor& x) { return x.to(runtime::Device::cpu()).item<double>(); };
  return {-value(neg), value(sum), value(max)};
}

}  // namespace

std::vector<CommBenchRow> run_comm_bench(ProcessGroup& group, const CommBenchOptions& o) {
  MT_CHECK(o.min_bytes >= 1 && o.max_bytes >= o.min_bytes && o.step_factor >= 2,
           "comm bench: expected 1 <= min bytes <= max bytes and a step factor >= 2, got ",
           o.min_bytes, ", ", o.max_bytes, ", ", o.step_factor);
  MT_CHECK(o.dtype == DType::F32 || o.dtype == DType::BF16,
           "comm bench: dtype must be f32 or bf16");
  MT_CHECK(o.iters >= 1 && o.warmup >= 0, "comm bench: expected iters >= 1 and warmup >= 0");
  MT_CHECK(o.skew >= 0, "comm bench: expected skew >= 0, got ", o.skew);
  MT_CHECK(o.all_to_all_weights.empty() || int64_t(o.all_to_all_weights.size()) == group.size(),
           "comm bench: all_to_all weights for ", o.all_to_all_weights.size(),
           " ranks, the group has ", group.size());
  MPI_Comm comm = MPI_COMM_NULL;
  if (o.compare_mpi) {
    const auto* mpi = dynamic_cast<const MpiProcessGroup*>(&group);
    MT_CHECK(mpi != nullptr, "comm bench: the raw MPI comparison needs an MPI group, not ",
             group.name());
    comm = mpi->communicator();
  }
  std::vector<CollectiveKind> ops = o.ops;
  if (ops.empty()) {
    ops = {CollectiveKind::AllReduce, CollectiveKind::AllGather, CollectiveKind::ReduceScatter,
           CollectiveKind::AllToAll,  CollectiveKind::Broadcast, CollectiveKind::SendRecv};
    if (group.device_type() == runtime::DeviceType::CPU)
      ops.push_back(CollectiveKind::PostedSendRecv);  // (not over NCCL: see make_case)
  }
  const int64_t n = group.size();
  std::vector<CommBenchRow> rows;
  for (CollectiveKind kind : ops) {
    const bool ring = kind == CollectiveKind::SendRecv || kind == CollectiveKind::PostedSendRecv;
    if (ring && n < 2) continue;  // a ring needs two ranks
    for (int64_t size = o.min_bytes; size <= o.max_bytes; size *= o.step_factor) {
      Case c = make_case(group, comm, kind, size, o);
      CommBenchRow row;
      row.kind = kind;
      row.bytes = c.bytes;
      row.count = c.count;
      int64_t errors = 0;
      const Times times = time_calls(group, o.device, c, o.warmup, o.iters, [&] {
        if (o.check) errors += c.check();
      });
      const std::vector<double> t = min_sum_max(group, o.device, times.ours);
      row.min_s = t[0];
      row.avg_s = t[1] / double(n);
      row.max_s = t[2];
      row.checked = o.check;
      row.errors = int64_t(min_sum_max(group, o.device, double(errors))[1]);
      row.algbw = algbw_bytes_per_second(row.bytes, std::max(row.max_s, 1e-12));
      row.uneven = kind == CollectiveKind::AllToAll && uneven_all_to_all(o);
      if (row.uneven) {
        // Every rank's off-rank bytes (the split sizes are known everywhere).
        std::vector<AllToAllTraffic> traffic;
        const int64_t esize = int64_t(runtime::dtype_size(o.dtype));
        const int64_t base = std::max<int64_t>(1, size / esize / n);
        for (int64_t from = 0; from < n; ++from) {
          std::vector<int64_t> s(static_cast<size_t>(n)), v(static_cast<size_t>(n));
          for (int64_t j = 0; j < n; ++j) {
            s[size_t(j)] = all_to_all_rows(o, base, from, j, n) * esize;
            v[size_t(j)] = all_to_all_rows(o, base, j, from, n) * esize;
          }
          traffic.push_back(all_to_all_traffic(s, v, from));
        }
        row.bottleneck_rank = bottleneck_rank(traffic);
        row.bottleneck_bytes = traffic[size_t(row.bottleneck_rank)].off_rank();
        row.bottleneck_bw = double(row.bottleneck_bytes) / std::max(row.max_s, 1e-12);
      } else {
        row.busbw = busbw_bytes_per_second(kind, n, row.bytes, std::max(row.max_s, 1e-12));
      }
      if (c.raw) {
        row.mpi_max_s = min_sum_max(group, o.device, times.raw)[2];
        row.mpi_busbw = busbw_bytes_per_second(kind, n, row.bytes, std::max(row.mpi_max_s, 1e-12));
      }
      rows.push_back(row);
    }
  }
  return rows;
}

std::vector<std::vector<double>> all_to_all_weights_from_trace(const std::string& dump_folder,
                                                               const std::string& name,
                                                               int64_t ranks) {
  std::vector<std::vector<double>> weights;
  for (int64_t r = 0; r < ranks; ++r) {
    const std::string path = dump_folder + "/comm/rank-" + std::to_string(r) + ".jsonl";
    std::ifstream in(path);
    MT_CHECK(in.good(), "comm bench: cannot read ", path,
             " (a [comm] trace dump of a run on as many ranks)");
    std::string line;
    for (int64_t n = 1; weights.size() == size_t(r) && std::getline(in, line); ++n) {
      const CommTraceLine l = parse_comm_trace_line(line, path + ":" + std::to_string(n));
      const CommRecord& rec = l.collective.record;
      if (l.is_step || !rec.uneven() || (!name.empty() && rec.name != name)) continue;
      MT_CHECK(int64_t(rec.send_bytes.size()) == ranks, path, ":", n, ": ", rec.name,
               " ran on a group of ", rec.send_bytes.size(), " ranks; the bench runs on ", ranks);
      weights.emplace_back(rec.send_bytes.begin(), rec.send_bytes.end());
    }
    MT_CHECK(weights.size() == size_t(r) + 1, path, " has no uneven all_to_all",
             name.empty() ? std::string() : " named '" + name + "'");
  }
  return weights;
}

std::string comm_bench_table(const std::vector<CommBenchRow>& rows, int64_t ranks, DType dtype) {
  std::ostringstream out;
  char line[320];
  const CommBenchRow* last = nullptr;
  for (const CommBenchRow& r : rows) {
    if (last == nullptr || last->kind != r.kind) {
      const bool mpi = std::any_of(rows.begin(), rows.end(), [&](const CommBenchRow& x) {
        return x.kind == r.kind && x.mpi_max_s > 0;
      });
      out << "# " << collective_kind_name(r.kind) << " on " << ranks << " ranks, "
          << runtime::dtype_name(dtype)
          << (r.uneven ? "; uneven: busbw has no meaning, the bottleneck rank's off-rank bytes "
                         "and bandwidth instead"
                       : "")
          << "\n";
      std::snprintf(line, sizeof(line), "%12s %12s %10s %10s %10s %9s %9s %7s%s\n", "size(B)",
                    "count", "min(us)", "avg(us)", "max(us)", "algbw", r.uneven ? "bneck" : "busbw",
                    "check", mpi ? "    mpi(us) mpi busbw  ours/mpi" : "");
      out << line;
    }
    last = &r;
    const std::string check = !r.checked ? "skip" : r.errors == 0 ? "ok" : "FAIL";
    const double bw = r.uneven ? r.bottleneck_bw : r.busbw;
    std::snprintf(line, sizeof(line), "%12lld %12lld %10.1f %10.1f %10.1f %9.3f %9.3f %7s",
                  (long long)r.bytes, (long long)r.count, r.min_s * 1e6, r.avg_s * 1e6,
                  r.max_s * 1e6, r.algbw / 1e9, bw / 1e9, check.c_str());
    out << line;
    if (r.mpi_max_s > 0) {
      std::snprintf(line, sizeof(line), " %10.1f %9.3f %9.3f", r.mpi_max_s * 1e6, r.mpi_busbw / 1e9,
                    r.busbw / std::max(r.mpi_busbw, 1e-30));
      out << line;
    }
    if (r.uneven) {
      out << "  (rank " << r.bottleneck_rank << ", " << r.bottleneck_bytes << " B off-rank)";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace mt::parallel
