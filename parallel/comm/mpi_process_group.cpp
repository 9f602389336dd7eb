// MPI backend: initialisation, communicators, and the chunked MPI calls behind each collective.
#include "parallel/comm/mpi_process_group.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "parallel/comm/mpi_runtime.h"
#include "runtime/core/error.h"

namespace mt::parallel {

using runtime::DType;

namespace {

std::atomic<int64_t> g_max_message_elements{INT_MAX};

MPI_Datatype mpi_type(DType d) {
  static_assert(sizeof(bool) == 1);
  switch (d) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::BF16:
    case DType::F16:
      return MPI_UINT16_T;  // moved, never reduced (the frontend upcasts)
    case DType::Bool:
      return MPI_UINT8_T;
  }
  MT_FAIL("MpiProcessGroup: unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
    case ReduceOp::Avg:
      break;
  }
  MT_FAIL("MpiProcessGroup: ", reduce_op_name(op), " must be lowered by the frontend");
}

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Calls fn(offset, count) over [0, n) in chunks of at most max_message_elements().
template <class Fn>
void for_each_chunk(int64_t n, Fn&& fn) {
  const int64_t limit = max_message_elements();
  for (int64_t off = 0; off < n; off += limit) fn(off, int(std::min(limit, n - off)));
}

}  // namespace

void set_max_message_elements(int64_t n) {
  MT_CHECK(n >= 1 && n <= INT_MAX, "set_max_message_elements: expected 1..INT_MAX, got ", n);
  g_max_message_elements = n;
}

int64_t max_message_elements() { return g_max_message_elements; }

void MpiProcessGroup::end_peers_after_error(int exit_code) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

bool MpiProcessGroup::launched_by_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  // srun without PMI: SLURM's variables only. One task is a single-process run; several would
  // each be one, or die in MPI_Init with OpenMPI's "not built with SLURM's PMI support".
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  if (tasks != nullptr && std::atoll(tasks) > 1) {
    const char* procid = std::getenv("SLURM_PROCID");
    MT_FAIL("srun started ", tasks, " tasks (this is task ", procid ? procid : "?",
            ") without PMIx, so they cannot find each other: launch with `srun --mpi=pmix ...` "
            "(or set MpiDefault=pmix in slurm.conf; `srun --mpi=list` shows the site's "
            "plugins), or with mpirun inside the allocation");
  }
  return false;
}

std::unique_ptr<MpiProcessGroup> MpiProcessGroup::world() {
  if (!mpi::active()) {
    return std::unique_ptr<MpiProcessGroup>(new MpiProcessGroup(MPI_COMM_NULL, "mpi:world"));
  }
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MT_CHECK(rc == MPI_SUCCESS, "MpiProcessGroup::world: MPI_Comm_dup failed: ",
           mpi::error_string(rc));
  return std::unique_ptr<MpiProcessGroup>(new MpiProcessGroup(comm, "mpi:world"));
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::string name)
    : comm_(comm), name_(std::move(name)) {
  if (comm_ == MPI_COMM_NULL) return;
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  check(MPI_Comm_dup(comm_, &p2p_comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(p2p_comm_, MPI_ERRORS_RETURN);
  // World ranks of the members, for timeout reports.
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(size_t(size_), 0);
  for (int r = 0; r < size_; ++r) ranks[size_t(r)] = r;
  world_ranks_.assign(size_t(size_), 0);
  MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_ranks_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  uid_ = mpi::agree_group_uid(comm_);
  mpi::register_group(uid_, this);
}

MpiProcessGroup::~MpiProcessGroup() {
  stop_comm_thread();
  if (comm_ == MPI_COMM_NULL) return;
  mpi::unregister_group(uid_);
  if (mpi::finalized()) return;
  MPI_Comm_free(&p2p_comm_);
  MPI_Comm_free(&comm_);
}

void MpiProcessGroup::check(int rc, const char* what) const {
  if (rc == MPI_SUCCESS) return;
  const CollectiveRecord call = last_collective();  // the caller's name for the failed call
  MT_FAIL(what, call.running && !call.name.empty() ? " '" + call.name + "'" : std::string(),
          " on group ", name_, " (rank ", rank_, " of ", size_, ") failed: ",
          mpi::error_string(rc),
          rc == MPI_ERR_TRUNCATE ? " (the ranks called it with different sizes: were they given "
                                   "the same config and data?)"
                                 : "");
}

void MpiProcessGroup::run_watched(const char* what, int peer, const std::function<int()>& call,
                                  std::optional<mpi::Clock::time_point> since) const {
  const CollectiveRecord entered = last_collective();
  const std::chrono::milliseconds limit = collective_timeout();
  const auto deadline = limit.count() > 0 ? since.value_or(entered.started) + limit
                                          : mpi::Clock::time_point::max();
  // The report runs on the monitor's thread while this one stays blocked; it copies what it
  // reads, so it never touches this group.
  mpi::WatchedCall watch(deadline, [group = name_, rank = rank_, size = size_,
                                    world_ranks = world_ranks_, uid = uid_, entered, limit, peer] {
    std::vector<PeerRecord> peers;
    for (int r = 0; r < size; ++r) {
      if (r == rank || (peer >= 0 && r != peer)) continue;
      peers.push_back({r, world_ranks[size_t(r)], std::nullopt});
    }
    mpi::query_peers(uid, peers, mpi::Clock::now() + std::chrono::seconds(5));
    mpi::abort_job(describe_collective_timeout(group, rank, size, entered,
                                               double(limit.count()) / 1000.0, peers, peer >= 0));
  });
  check(call(), what);
}

void MpiProcessGroup::wait(std::vector<MPI_Request>& requests, const char* what) const {
  std::vector<MPI_Status> statuses(requests.size());
  run_watched(what, -1, [&] {
    const int rc = MPI_Waitall(int(requests.size()), requests.data(), statuses.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& s : statuses) {
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) return s.MPI_ERROR;
      }
    }
    return rc;
  });
}

std::unique_ptr<ProcessGroup> MpiProcessGroup::split(int color, int key) {
  MT_CHECK(color >= 0, "split on group ", name_, ": color must be >= 0, got ", color);
  std::string child = detail::concat(name_, "/split(", color, ",", key, ")");
  if (comm_ == MPI_COMM_NULL) {
    return std::unique_ptr<MpiProcessGroup>(new MpiProcessGroup(MPI_COMM_NULL, child));
  }
  MPI_Comm comm = MPI_COMM_NULL;
  // A barrier-like sync call keeps the split ordered after any queued async collective.
  barrier("split");
  check(MPI_Comm_split(comm_, color, key, &comm), "MPI_Comm_split");
  return std::unique_ptr<MpiProcessGroup>(new MpiProcessGroup(comm, child));
}

void MpiProcessGroup::do_all_reduce(const Tensor& buf, ReduceOp op) {
  if (comm_ == MPI_COMM_NULL) return;
  const size_t es = buf.element_size();
  for_each_chunk(buf.numel(), [&](int64_t off, int count) {
    run_watched("all_reduce (MPI_Allreduce)", -1, [&] {
      return MPI_Allreduce(MPI_IN_PLACE, bytes_of(buf) + off * es, count, mpi_type(buf.dtype()),
                           mpi_op(op), comm_);
    });
  });
}

void MpiProcessGroup::do_all_gather(const Tensor& out, const Tensor& in) {
  const int64_t n = in.numel();
  const size_t es = in.element_size();
  if (comm_ == MPI_COMM_NULL) {
    if (n > 0) std::memcpy(out.data_ptr(), in.data_ptr(), size_t(n) * es);
    return;
  }
  MPI_Datatype type = mpi_type(in.dtype());
  const char* what = "all_gather_into (MPI_Allgather)";
  if (n <= max_message_elements()) {
    run_watched(what, -1, [&] {
      return MPI_Allgather(in.data_ptr(), int(n), type, out.data_ptr(), int(n), type, comm_);
    });
    return;
  }
  // Chunked: gather chunk [off, off+count) of every rank, then scatter it into the rank blocks.
  std::vector<char> tmp(size_t(size_) * size_t(max_message_elements()) * es);
  for_each_chunk(n, [&](int64_t off, int count) {
    run_watched(what, -1, [&] {
      return MPI_Allgather(bytes_of(in) + off * es, count, type, tmp.data(), count, type, comm_);
    });
    for (int rank = 0; rank < size_; ++rank) {
      std::memcpy(bytes_of(out) + (rank * n + off) * es, tmp.data() + size_t(rank) * count * es,
                  size_t(count) * es);
    }
  });
}

void MpiProcessGroup::do_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  const int64_t n = out.numel();
  const size_t es = in.element_size();
  if (comm_ == MPI_COMM_NULL) {
    if (n > 0) std::memcpy(out.data_ptr(), in.data_ptr(), size_t(n) * es);
    return;
  }
  MPI_Datatype type = mpi_type(in.dtype());
  const char* what = "reduce_scatter_into (MPI_Reduce_scatter_block)";
  if (n <= max_message_elements()) {
    run_watched(what, -1, [&] {
      return MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), int(n), type, mpi_op(op),
                                      comm_);
    });
    return;
  }
  // Chunked: pack chunk [off, off+count) of every rank block, reduce-scatter it.
  std::vector<char> tmp(size_t(size_) * size_t(max_message_elements()) * es);
  for_each_chunk(n, [&](int64_t off, int count) {
    for (int rank = 0; rank < size_; ++rank) {
      std::memcpy(tmp.data() + size_t(rank) * count * es, bytes_of(in) + (rank * n + off) * es,
                  size_t(count) * es);
    }
    run_watched(what, -1, [&] {
      return MPI_Reduce_scatter_block(tmp.data(), bytes_of(out) + off * es, count, type,
                                      mpi_op(op), comm_);
    });
  });
}

void MpiProcessGroup::do_broadcast(const Tensor& buf, int root) {
  if (comm_ == MPI_COMM_NULL) return;
  const size_t es = buf.element_size();
  for_each_chunk(buf.numel(), [&](int64_t off, int count) {
    run_watched("broadcast (MPI_Bcast)", -1, [&] {
      return MPI_Bcast(bytes_of(buf) + off * es, count, mpi_type(buf.dtype()), root, comm_);
    });
  });
}

void MpiProcessGroup::do_barrier() {
  if (comm_ == MPI_COMM_NULL) return;
  run_watched("barrier (MPI_Barrier)", -1, [&] { return MPI_Barrier(comm_); });
}

void MpiProcessGroup::do_all_to_all(const Tensor& out, const Tensor& in,
                                    const std::vector<int64_t>& out_counts,
                                    const std::vector<int64_t>& in_counts) {
  const size_t es = in.element_size();
  // Every rank checks that what each peer sends it matches what it expects, then all ranks agree,
  // so a mismatch throws everywhere instead of hanging.
  std::vector<int64_t> sent_to_me(size_t(size_), in_counts[0]);
  if (comm_ != MPI_COMM_NULL) {
    run_watched("all_to_all_single (MPI_Alltoall of split sizes)", -1, [&] {
      return MPI_Alltoall(in_counts.data(), 1, MPI_INT64_T, sent_to_me.data(), 1, MPI_INT64_T,
                          comm_);
    });
  }
  int bad_peer = -1;
  for (int j = 0; j < size_ && bad_peer < 0; ++j) {
    if (sent_to_me[size_t(j)] != out_counts[size_t(j)]) bad_peer = j;
  }
  int any_bad = bad_peer >= 0 ? 1 : 0;
  if (comm_ != MPI_COMM_NULL) {
    run_watched("all_to_all_single (MPI_Allreduce of the split check)", -1, [&] {
      return MPI_Allreduce(MPI_IN_PLACE, &any_bad, 1, MPI_INT, MPI_MAX, comm_);
    });
  }
  if (any_bad) {
    if (bad_peer >= 0) {
      MT_FAIL("all_to_all_single on group ", name_, " (rank ", rank_, " of ", size_, "): expected ",
              out_counts[size_t(bad_peer)], " elements from rank ", bad_peer,
              " (out_splits), which sends ", sent_to_me[size_t(bad_peer)],
              " (its in_splits); out shape ", out.shape(), ", in shape ", in.shape());
    }
    MT_FAIL("all_to_all_single on group ", name_, " (rank ", rank_, " of ", size_,
            "): split sizes disagree between other ranks of the group");
  }
  std::vector<int64_t> in_displ(size_t(size_), 0), out_displ(size_t(size_), 0);
  for (int j = 1; j < size_; ++j) {
    in_displ[size_t(j)] = in_displ[size_t(j - 1)] + in_counts[size_t(j - 1)];
    out_displ[size_t(j)] = out_displ[size_t(j - 1)] + out_counts[size_t(j - 1)];
  }
  const size_t me = size_t(rank_);
  if (in_counts[me] > 0) {
    std::memcpy(bytes_of(out) + out_displ[me] * es, bytes_of(in) + in_displ[me] * es,
                size_t(in_counts[me]) * es);
  }
  if (comm_ == MPI_COMM_NULL) return;
  // Point-to-point on the group's private communicator: chunks between a pair arrive in order.
  MPI_Datatype type = mpi_type(in.dtype());
  std::vector<MPI_Request> requests;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    for_each_chunk(out_counts[size_t(j)], [&](int64_t off, int count) {
      requests.emplace_back();
      check(MPI_Irecv(bytes_of(out) + (out_displ[size_t(j)] + off) * es, count, type, j, 0,
                      p2p_comm_, &requests.back()),
            "all_to_all_single (MPI_Irecv)");
    });
    for_each_chunk(in_counts[size_t(j)], [&](int64_t off, int count) {
      requests.emplace_back();
      check(MPI_Isend(bytes_of(in) + (in_displ[size_t(j)] + off) * es, count, type, j, 0,
                      p2p_comm_, &requests.back()),
            "all_to_all_single (MPI_Isend)");
    });
  }
  wait(requests, "all_to_all_single (MPI_Irecv/MPI_Isend)");
}

void MpiProcessGroup::do_send(const Tensor& buf, int dst, int tag) {
  const size_t es = buf.element_size();
  for_each_chunk(buf.numel(), [&](int64_t off, int count) {
    run_watched("send (MPI_Send)", dst, [&] {
      return MPI_Send(bytes_of(buf) + off * es, count, mpi_type(buf.dtype()), dst, tag, comm_);
    });
  });
}

void MpiProcessGroup::do_recv(const Tensor& buf, int src, int tag) {
  const size_t es = buf.element_size();
  MPI_Datatype type = mpi_type(buf.dtype());
  for_each_chunk(buf.numel(), [&](int64_t off, int count) {
    MPI_Status status;
    run_watched("recv (MPI_Recv)", src, [&] {
      return MPI_Recv(bytes_of(buf) + off * es, count, type, src, tag, comm_, &status);
    });
    int got = 0;
    MPI_Get_count(&status, type, &got);
    MT_CHECK(got == count, "recv on group ", name_, " (rank ", rank_, " of ", size_, "): expected ",
             count, " elements from rank ", src, " with tag ", tag, ", got ", got,
             "; tensor shape ", buf.shape());
  });
}

std::optional<Work> MpiProcessGroup::post_send(const Tensor& buf, int dst, int tag) {
  if (comm_ == MPI_COMM_NULL) return std::nullopt;
  std::vector<MPI_Request> requests;
  const size_t es = buf.element_size();
  for_each_chunk(buf.numel(), [&](int64_t off, int count) {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Isend(bytes_of(buf) + off * es, count, mpi_type(buf.dtype()), dst, tag, comm_,
                    &request),
          "isend (MPI_Isend)");
    requests.push_back(request);
  });
  return posted_work(std::move(requests), buf, false, "isend (MPI_Isend)", dst);
}

std::optional<Work> MpiProcessGroup::post_recv(const Tensor& buf, int src, int tag) {
  if (comm_ == MPI_COMM_NULL) return std::nullopt;
  std::vector<MPI_Request> requests;
  const size_t es = buf.element_size();
  for_each_chunk(buf.numel(), [&](int64_t off, int count) {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Irecv(bytes_of(buf) + off * es, count, mpi_type(buf.dtype()), src, tag, comm_,
                    &request),
          "irecv (MPI_Irecv)");
    requests.push_back(request);
  });
  return posted_work(std::move(requests), buf, true, "irecv (MPI_Irecv)", src);
}

Work MpiProcessGroup::posted_work(std::vector<MPI_Request> requests, const Tensor& buf,
                                  bool receive, const char* what, int peer) {
  // One state per posted call, shared by the Work's copies: the requests, the buffer they use
  // (kept alive until they complete) and the verdict once known.
  struct Posted {
    std::vector<MPI_Request> requests;
    Tensor buf;
    mpi::Clock::time_point since = mpi::Clock::now();
    bool done = false;
  };
  auto state = std::make_shared<Posted>(Posted{std::move(requests), buf});
  const int64_t limit = max_message_elements();
  // Checks what completed requests received: chunk i of a receive holds min(limit, rest) elements.
  auto finish = [this, state, receive, peer, limit](const std::vector<MPI_Status>& statuses) {
    state->done = true;
    if (!receive) return;
    MPI_Datatype type = mpi_type(state->buf.dtype());
    for (size_t i = 0; i < statuses.size(); ++i) {
      int got = 0;
      MPI_Get_count(&statuses[i], type, &got);
      const int64_t expected = std::min(limit, state->buf.numel() - int64_t(i) * limit);
      MT_CHECK(got == expected, "irecv on group ", name_, " (rank ", rank_, " of ", size_,
               "): expected ", expected, " elements from rank ", peer, ", got ", got,
               "; tensor shape ", state->buf.shape());
    }
  };
  auto wait = [this, state, finish, what, peer] {
    if (state->done) return;
    std::vector<MPI_Status> statuses(state->requests.size());
    run_watched(what, peer, [&] {
      return MPI_Waitall(int(state->requests.size()), state->requests.data(), statuses.data());
    }, state->since);
    finish(statuses);
  };
  auto test = [this, state, finish, what] {
    if (state->done) return true;
    std::vector<MPI_Status> statuses(state->requests.size());
    int flag = 0;
    check(MPI_Testall(int(state->requests.size()), state->requests.data(), &flag,
                      statuses.data()),
          what);
    if (flag != 0) finish(statuses);
    return flag != 0;
  };
  return Work(std::move(wait), std::move(test));
}

}  // namespace mt::parallel
