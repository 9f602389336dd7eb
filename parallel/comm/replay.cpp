// Replay of traced steps: groups from members, buffers by storage id, the collectives (and, with
// compute, the kernels) in order.
#include "parallel/comm/replay.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "runtime/core/allocator.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/core/kernel_replay.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"

namespace mt::parallel {

namespace {

using runtime::DType;
using runtime::Tensor;

ReduceOp reduce_op_from(const std::string& name, const std::string& where) {
  if (name == "sum") return ReduceOp::Sum;
  if (name == "avg") return ReduceOp::Avg;
  if (name == "max") return ReduceOp::Max;
  if (name == "min") return ReduceOp::Min;
  MT_FAIL(where, ": unknown reduce op '", name, "'");
}

std::string where_of(const TraceNode& n) {
  return detail::concat("trace node ", n.id, " (", n.collective.name, " ", n.collective.collective,
                        ")");
}

// The groups every trace's collectives ran on, rebuilt by splitting `world` (collective: every
// rank walks the same sorted member lists).
class Groups {
 public:
  Groups(ProcessGroup& world, const std::vector<ExecutionTrace>& traces) : world_(world) {
    std::set<std::vector<int>> all;
    for (const ExecutionTrace& t : traces) {
      for (const TraceNode& n : t.nodes) {
        if (n.type != TraceNode::Type::Collective) continue;
        MT_CHECK(!n.collective.members.empty(), where_of(n), " on rank ", t.rank,
                 " has no member list (its backend did not record world ranks): cannot replay");
        all.insert(n.collective.members);
      }
    }
    everyone_.resize(size_t(world.size()));
    for (int r = 0; r < world.size(); ++r) everyone_[size_t(r)] = r;
    for (const std::vector<int>& members : all) {
      if (members == everyone_) continue;
      const auto me = std::find(members.begin(), members.end(), world.rank());
      const bool in = me != members.end();
      // Non-members split off together; their group is kept (freeing is collective in MPI).
      std::shared_ptr<ProcessGroup> g =
          world.split(in ? 0 : 1, in ? int(me - members.begin()) : world.rank());
      (in ? groups_[members] : others_.emplace_back()) = std::move(g);
    }
  }

  ProcessGroup& operator()(const std::vector<int>& members) {
    if (members == everyone_) return world_;
    return *groups_.at(members);
  }

 private:
  ProcessGroup& world_;
  std::vector<int> everyone_;
  std::map<std::vector<int>, std::shared_ptr<ProcessGroup>> groups_;
  std::vector<std::shared_ptr<ProcessGroup>> others_;
};

// One tensor use of a call: its storage, dtype and (scaled) shape.
struct Use {
  uint64_t storage = 0;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // a kernel's view as traced; empty: contiguous from 0
  int64_t offset = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // Elements of the storage the use reaches (from element 0).
  int64_t extent() const {
    if (strides.empty()) return numel();
    if (numel() == 0) return 0;
    int64_t last = offset;
    for (size_t d = 0; d < shape.size(); ++d)
      last += (shape[d] - 1) * std::max<int64_t>(strides[d], 0);
    return last + 1;
  }
};

// A 0-d tensor (a scalar all-reduce) stays as it is.
std::vector<int64_t> scaled(std::vector<int64_t> shape, int64_t k) {
  if (!shape.empty()) shape[0] *= k;
  return shape;
}

// The buffers of the replay, by (storage id, dtype): allocated up front or at first use, freed
// after last use (lazy), each filled with a constant from its id when allocated.
class Buffers {
 public:
  using Key = std::pair<uint64_t, DType>;

  Buffers(const std::vector<std::vector<Use>>& calls, bool lazy, runtime::Device device)
      : lazy_(lazy), device_(device) {
    for (size_t i = 0; i < calls.size(); ++i) {
      for (const Use& u : calls[i]) {
        const Key k{u.storage, u.dtype};
        numel_[k] = std::max(numel_[k], u.extent());
        last_use_[k] = i;
      }
    }
    if (!lazy_) {
      for (const auto& [k, n] : numel_) allocate(k);
    }
  }

  Tensor view(const Use& u) {
    const Key k{u.storage, u.dtype};
    if (!live_.count(k)) allocate(k);
    if (!u.strides.empty()) return live_.at(k).as_strided(u.shape, u.strides, u.offset);
    return live_.at(k).narrow(0, 0, u.numel()).view(u.shape);
  }

  // After call i: frees what it used last (lazy).
  void release_after(size_t i) {
    if (!lazy_) return;
    for (auto it = live_.begin(); it != live_.end();) {
      it = last_use_.at(it->first) == i ? live_.erase(it) : std::next(it);
    }
  }

 private:
  void allocate(const Key& k) {
    Tensor t = runtime::empty({std::max<int64_t>(1, numel_.at(k))},
                              runtime::TensorOptions{}.with_dtype(k.second).with_device(device_));
    if (k.second != DType::Bool) t.fill_(double(k.first % 13 + 1));
    live_[k] = t;
  }

  bool lazy_;
  runtime::Device device_;
  std::map<Key, int64_t> numel_;
  std::map<Key, size_t> last_use_;
  std::map<Key, Tensor> live_;
};

std::vector<Use> uses_of(const CommRecord& r, int64_t k) {
  std::vector<Use> uses;
  const DType dtype = r.dtype.empty() ? DType::F32 : runtime::dtype_from_name(r.dtype);
  auto add = [&](uint64_t storage, const std::vector<int64_t>& shape) {
    if (storage == 0) return;
    uses.push_back({storage, dtype, scaled(shape, k), {}, 0});
  };
  add(r.in_storage, r.in_shape);
  if (r.out_storage != r.in_storage || r.in_storage == 0) add(r.out_storage, r.out_shape);
  return uses;
}

// Copies between the host and a device, and host waits for a device: the profiler records them
// beside the kernels (Tensor::to, runtime::synchronize, HostCopy::get), under these names.
bool is_copy_to_device(const TraceNode& n) { return n.name == "copy_to_device"; }
bool is_copy_to_host(const TraceNode& n) { return n.name == "copy_to_host"; }
bool is_host_wait(const TraceNode& n) {
  return n.name == "synchronize" || n.name == "host_copy_wait";
}

// The tensors an op uses on the replay's device (a transfer's host side is not one of them).
std::vector<Use> uses_of_op(const TraceNode& n) {
  std::vector<Use> uses;
  for (const auto* list : {&n.inputs, &n.outputs}) {
    if ((list == &n.inputs && is_copy_to_device(n)) || (list == &n.outputs && is_copy_to_host(n)))
      continue;
    for (const runtime::TensorMeta& t : *list)
      uses.push_back({t.storage, runtime::dtype_from_name(t.dtype), t.shape, t.strides, t.offset});
  }
  return uses;
}

// Replays a transfer or a host wait as what it was: the recorded bytes copied from a (zeroed)
// host tensor to the device, or from the device to the host; a wait for the device.
std::string replay_host_transfer(const TraceNode& n, const std::vector<Use>& uses,
                                 Buffers& buffers, runtime::Device device) {
  if (is_host_wait(n)) {
    runtime::synchronize(device);
    return "";
  }
  if (uses.size() != 1) return "the trace records no tensors for this copy";
  const Tensor on_device = buffers.view(uses[0]);
  if (is_copy_to_device(n)) {
    const auto on_host = runtime::TensorOptions{}.with_dtype(on_device.dtype());
    on_device.copy_(runtime::zeros(on_device.shape(), on_host));
  } else {
    (void)on_device.to(runtime::Device::cpu());
  }
  return "";
}

// Re-runs a traced kernel on the replay's buffers (its tensors in the recorded order); returns
// why it could not, or "" when it ran.
std::string replay_op(const TraceNode& n, int schema, const std::vector<Use>& uses,
                      Buffers& buffers, runtime::Device device) {
  if (device.is_cuda() && (is_copy_to_device(n) || is_copy_to_host(n) || is_host_wait(n)))
    return replay_host_transfer(n, uses, buffers, device);
  const bool cuda_kernel = n.device.starts_with("cuda");
  if (cuda_kernel != device.is_cuda()) {
    return "a " + n.device + " kernel, in a replay on " + runtime::device_description(device);
  }
  if (schema < 2) return "the trace records no arguments (schema 1)";
  const runtime::KernelReplayer* replayer = runtime::find_kernel_replayer(n.name);
  if (replayer == nullptr) return "no kernel named '" + n.name + "' in this build";
  runtime::KernelCall call;
  call.device = device;
  call.args = n.args;
  for (size_t i = 0; i < uses.size(); ++i)
    (i < n.inputs.size() ? call.inputs : call.outputs).push_back(buffers.view(uses[i]));
  try {
    (*replayer)(call);
  } catch (const Error& e) {
    const std::string what = e.what();
    return what.substr(0, what.find('\n'));
  }
  return "";
}

// Rows of an all_to_all split from its bytes.
std::vector<int64_t> split_rows(const std::vector<int64_t>& bytes, int64_t row_bytes, int64_t k,
                                const std::string& where) {
  std::vector<int64_t> rows;
  for (int64_t b : bytes) {
    MT_CHECK(b % row_bytes == 0, where, ": split of ", b, " bytes is not whole rows of ", row_bytes,
             " bytes");
    rows.push_back(b / row_bytes * k);
  }
  return rows;
}

uint64_t mix(uint64_t h, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return (h ^ bits) * 1099511628211ull;
}

double micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// Issued now and waited for at its wait node: a posted message (always: two ranks may post
// crossing messages before either waits), or, when replaying with overlap, an async call of a
// trace that records its waits (schema 3; older traces' async calls replay synchronously).
bool deferred(const CommRecord& r, int schema, bool overlap = true) {
  return r.posted() || (overlap && r.async && schema >= 3);
}

// From the first traced node's issue to the last one's end, in microseconds.
double traced_span_us(const ExecutionTrace& t) {
  double first = 0, last = 0;
  bool any = false;
  for (const TraceNode& n : t.nodes) {
    double end = n.issued_us + n.dur_us;
    if (n.type == TraceNode::Type::Collective)
      end = n.issued_us + (n.collective.end_us - n.collective.issued_us);
    first = any ? std::min(first, n.issued_us) : n.issued_us;
    last = any ? std::max(last, end) : end;
    any = true;
  }
  return last - first;
}

// Issues the traced call `r` on `g` with the replay's buffers (async when `async`).
Work issue_call(ProcessGroup& g, const CommRecord& r, const Tensor& in, const Tensor& out,
                int64_t scale, bool async, const std::string& where) {
  const std::string name = "replay." + r.name;
  const std::string& c = r.collective;
  if (c == "all_reduce") return g.all_reduce(in, reduce_op_from(r.reduce_op, where), name, async);
  if (c == "all_gather_into") return g.all_gather_into(out, in, name, async);
  if (c == "reduce_scatter_into")
    return g.reduce_scatter_into(out, in, reduce_op_from(r.reduce_op, where), name, async);
  if (c == "all_to_all_single") {
    int64_t row = int64_t(in.element_size());  // bytes of one row: the dims after the first
    for (int64_t d = 1; d < in.dim(); ++d) row *= in.size(d);
    return g.all_to_all_single(out, in, split_rows(r.recv_bytes, row, scale, where),
                               split_rows(r.send_bytes, row, scale, where), name, async);
  }
  if (c == "broadcast") return g.broadcast(in, r.peer, name, async);
  if (c == "barrier") return g.barrier(name, async);
  if (c == "send") return g.send(in, r.peer, r.tag, name, async);
  if (c == "recv") return g.recv(out, r.peer, r.tag, name, async);
  if (c == "isend") return g.isend(in, r.peer, r.tag, name);
  if (c == "irecv") return g.irecv(out, r.peer, r.tag, name);
  MT_FAIL(where, ": cannot replay '", c, "'");
}

// The last of the nodes that node i's call covers: itself, or the last op of its
// batch_isend_irecv (consecutive nodes in the trace, execution_trace.h).
size_t last_node_of_call(const std::vector<const TraceNode*>& nodes, size_t i) {
  size_t last = i;
  const int64_t batch = nodes[i]->collective.batch;
  while (batch != 0 && last + 1 < nodes.size() &&
         nodes[last + 1]->type == TraceNode::Type::Collective &&
         nodes[last + 1]->collective.batch == batch) {
    ++last;
  }
  return last;
}

// A traced call about to be replayed: its node, the replay's buffers for it, what the replay
// reports of it, whether it is deferred (waited for at its wait node) and writes its output.
struct CallToReplay {
  size_t node = 0;
  Tensor in, out;
  ReplayedCall call;
  bool later = false, writes = false;
  Work work;
};

CallToReplay prepare_call(const TraceNode& node, size_t index, const std::vector<Use>& uses,
                          Buffers& buffers, int schema, const ReplayOptions& o) {
  const CommRecord& r = node.collective;
  CallToReplay x;
  x.node = index;
  for (const Use& u : uses) {
    if (u.storage == r.in_storage && !x.in.defined()) x.in = buffers.view(u);
    if (u.storage == r.out_storage) x.out = buffers.view(u);
  }
  if (!x.out.defined()) x.out = x.in;
  if (!x.in.defined()) x.in = x.out;
  x.later = deferred(r, schema, o.overlap);
  x.writes = r.collective != "send" && r.collective != "isend" && r.collective != "barrier";
  ReplayedCall& c = x.call;
  c.node_id = node.id;
  c.collective = r.collective;
  c.name = r.name;
  c.members = r.members;
  c.size_bytes =
      r.in_shape.empty() && r.out_shape.empty() ? r.size_bytes : r.size_bytes * o.scale_bytes;
  c.deferred = x.later;
  c.recorded_us = x.later && r.waited_us > 0 ? std::max(r.end_us, r.waited_us) - r.issued_us
                                             : r.end_us - r.start_us;
  return x;
}

// The sends and receives of one traced batch, as batch_isend_irecv posts them.
std::vector<ProcessGroup::P2POp> batch_ops(const std::vector<const TraceNode*>& nodes,
                                           const std::vector<CallToReplay>& calls) {
  std::vector<ProcessGroup::P2POp> ops;
  const std::vector<int>& members = nodes[calls.front().node]->collective.members;
  for (const CallToReplay& x : calls) {
    const CommRecord& op = nodes[x.node]->collective;
    const std::string where = where_of(*nodes[x.node]);
    MT_CHECK(op.posted() || op.collective == "send" || op.collective == "recv", where,
             ": a batch holds only sends and receives, not '", op.collective, "'");
    MT_CHECK(op.members == members, where, ": the ops of a batch are on one group");
    const bool send = op.collective == "isend" || op.collective == "send";
    ops.push_back({send ? ProcessGroup::P2POp::Kind::Send : ProcessGroup::P2POp::Kind::Recv,
                   send ? x.in : x.out, op.peer, op.tag, "replay." + op.name});
  }
  return ops;
}

}  // namespace

bool trace_ran_on_gpu(const std::vector<ExecutionTrace>& traces) {
  for (const ExecutionTrace& t : traces) {
    for (const TraceNode& n : t.nodes) {
      if (n.type == TraceNode::Type::Op && n.device.starts_with("cuda")) return true;
      if (n.type == TraceNode::Type::Collective && n.collective.group.starts_with("nccl:"))
        return true;
    }
  }
  return false;
}

// Whether a traced call is a point-to-point message (matched by peer, not by group order).
bool is_message(const CommRecord& c) {
  return c.posted() || c.collective == "send" || c.collective == "recv";
}

// Every rank reads every trace, so each checks alike, before any collective, that the traces make
// one step the ranks can replay together: one trace per rank, all of one step, the same
// collectives in the same order on each group, and as many messages received as sent between
// each pair of ranks. Otherwise a replay would wait forever for a call a peer never issues.
void check_traces_agree(const std::vector<ExecutionTrace>& traces, int n) {
  std::vector<int> seen(size_t(n), 0);
  const ExecutionTrace& first = traces.front();
  for (const ExecutionTrace& t : traces) {
    MT_CHECK(t.rank >= 0 && t.rank < n, "replay: a trace of rank ", t.rank, " in a replay on ", n,
             " ranks");
    MT_CHECK(seen[size_t(t.rank)]++ == 0, "replay: two traces of rank ", t.rank,
             " (and none of another): give one trace per rank");
    MT_CHECK(t.step == first.step, "replay: the traces are of different steps (rank ", first.rank,
             ": step ", first.step, ", rank ", t.rank, ": step ", t.step,
             "): give the traces of one step");
  }
  // A group's members -> each member's calls on it, in order.
  std::map<std::vector<int>, std::map<int, std::vector<std::string>>> calls;
  std::map<std::pair<int, int>, int64_t> unmatched;  // (from, to) in world ranks: sent - received
  for (const ExecutionTrace& t : traces) {
    for (const TraceNode& node : t.nodes) {
      const CommRecord& c = node.collective;
      if (node.type != TraceNode::Type::Collective || c.members.empty()) continue;
      if (!is_message(c)) {
        calls[c.members][t.rank].push_back(c.collective);
        continue;
      }
      MT_CHECK(c.peer >= 0 && c.peer < int(c.members.size()), where_of(node), " on rank ", t.rank,
               ": peer ", c.peer, " is not a member of its group of ", c.members.size());
      const int peer = c.members[size_t(c.peer)];
      const bool sends = c.collective == "send" || c.collective == "isend";
      unmatched[sends ? std::pair{t.rank, peer} : std::pair{peer, t.rank}] += sends ? 1 : -1;
    }
  }
  for (const auto& [members, by_rank] : calls) {
    const int a = members.front();
    auto calls_of = [&](int r) {
      const auto it = by_rank.find(r);
      return it == by_rank.end() ? std::vector<std::string>{} : it->second;
    };
    const std::vector<std::string> want = calls_of(a);
    for (int b : members) {
      const std::vector<std::string> got = calls_of(b);
      if (got == want) continue;
      size_t i = 0;
      while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
      auto call = [&](const std::vector<std::string>& v) {
        return i < v.size() ? v[i] : std::string("nothing (its trace ends)");
      };
      std::string ranks;
      for (int m : members) ranks += (ranks.empty() ? "" : ", ") + std::to_string(m);
      MT_FAIL("replay: the traces disagree on the group of ranks ", ranks,
              ": its call ", i + 1, " is ", call(want), " on rank ", a, " but ", call(got),
              " on rank ", b, " (", want.size(), " and ", got.size(),
              " calls): give one step's complete traces");
    }
  }
  for (const auto& [pair, count] : unmatched) {
    MT_CHECK(count == 0, "replay: rank ", pair.first, " sends rank ", pair.second, " ",
             count > 0 ? "more" : "fewer", " messages than that rank receives (by ",
             count > 0 ? count : -count, "): give one step's complete traces");
  }
}

ReplayResult replay_step(ProcessGroup& world, const std::vector<ExecutionTrace>& traces,
                         const ReplayOptions& o) {
  const runtime::Device device = world.device();
  MT_CHECK(o.scale_bytes >= 1, "replay: scale_bytes must be >= 1, got ", o.scale_bytes);
  MT_CHECK(o.iterations >= 1, "replay: iterations must be >= 1, got ", o.iterations);
  const int n = world.size();
  MT_CHECK(int(traces.size()) == n, "replay: ", traces.size(), " traces for ", n,
           " ranks: replay runs on as many ranks as the traced step");
  const ExecutionTrace* mine = nullptr;
  for (const ExecutionTrace& t : traces) {
    MT_CHECK(t.world_size == n, "replay: the trace of rank ", t.rank, " was recorded on ",
             t.world_size, " ranks, this replay has ", n);
    if (t.rank == world.rank()) mine = &t;
  }
  check_traces_agree(traces, n);  // the same verdict on every rank
  MT_CHECK(mine != nullptr, "replay: no trace for rank ", world.rank());
  Groups groups(world, traces);

  MT_CHECK(!o.compute || o.scale_bytes == 1,
           "replay: scale_bytes applies to collectives only, not to a replay with compute (the "
           "kernels' shapes would no longer fit together)");
  std::vector<const TraceNode*> nodes;
  std::vector<std::vector<Use>> uses;
  std::set<int64_t> awaited;  // deferred calls not yet waited for, by node id
  for (const TraceNode& node : mine->nodes) {
    const bool collective = node.type == TraceNode::Type::Collective;
    if (node.type == TraceNode::Type::Op && !o.compute) continue;
    if (node.type == TraceNode::Type::Wait) {
      MT_CHECK(awaited.erase(node.waits_for) == 1, "replay: trace node ", node.id, " of rank ",
               mine->rank, " waits for node ", node.waits_for,
               ", which is not an isend, irecv or async collective before it");
    } else if (collective && deferred(node.collective, mine->schema)) {
      awaited.insert(node.id);
    }
    nodes.push_back(&node);
    uses.push_back(collective          ? uses_of(node.collective, o.scale_bytes)
                   : node.type == TraceNode::Type::Op ? uses_of_op(node)
                                                      : std::vector<Use>{});
  }

  ReplayResult result;
  result.recorded_step_us = traced_span_us(*mine);
  for (int64_t iteration = 0; iteration < o.iterations; ++iteration) {
    const bool last = iteration + 1 == o.iterations;
    const int64_t before = runtime::memory_stats(device).bytes_in_use;
    runtime::reset_peak_memory(device);
    Buffers buffers(uses, o.allocation == ReplayOptions::Allocation::Lazy, device);
    uint64_t digest = 1469598103934665603ull;
    std::vector<ReplayedCall> timed;
    std::vector<ReplayedOp> ops;
    // Deferred calls by node id, until their wait node (or the end): the Work, when it was
    // issued, its place in `timed` and what it writes (undefined: nothing).
    struct Pending {
      Work work;
      std::chrono::steady_clock::time_point issued;
      size_t call = 0;
      Tensor written;
    };
    std::map<int64_t, Pending> pending;
    // Each output's sum, in order, read into the digest after the step (on a GPU queued there,
    // so the digest makes the replay wait for nothing).
    std::vector<Tensor> written_sums;
    double digest_us = 0;  // the time spent on the digest, left out of the step's
    auto absorb = [&](const Tensor& written) {
      if (written.dtype() == DType::Bool) return;
      const auto t0 = std::chrono::steady_clock::now();
      written_sums.push_back(runtime::sum(written.to(DType::F64)));
      digest_us += micros_since(t0);
    };
    auto complete = [&](std::map<int64_t, Pending>::iterator it) {
      it->second.work.wait();
      runtime::synchronize(device);  // a GPU's call has run (no-op on the CPU)
      timed[it->second.call].replayed_us = micros_since(it->second.issued);
      if (it->second.written.defined()) absorb(it->second.written);
      pending.erase(it);
    };
    world.barrier("replay_start");  // not "replay.": those are the traced calls
    const auto step_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i]->type == TraceNode::Type::Wait) {
        if (auto it = pending.find(nodes[i]->waits_for); it != pending.end()) complete(it);
        continue;  // (not pending: it ran synchronously, without overlap)
      }
      if (nodes[i]->type == TraceNode::Type::Op) {
        const auto t0 = std::chrono::steady_clock::now();
        ReplayedOp op{nodes[i]->id, nodes[i]->name, nodes[i]->dur_us, 0,
                      replay_op(*nodes[i], mine->schema, uses[i], buffers, device)};
        op.replayed_us = micros_since(t0);
        ops.push_back(std::move(op));
        buffers.release_after(i);
        continue;
      }
      // A traced batch_isend_irecv is posted as one batch again: on in-order streams (NCCL)
      // its ops posted one by one can wait on each other (a ring pass's receive before its send).
      const size_t last_node = last_node_of_call(nodes, i);
      std::vector<CallToReplay> issued;
      for (size_t j = i; j <= last_node; ++j) {
        issued.push_back(prepare_call(*nodes[j], j, uses[j], buffers, mine->schema, o));
      }
      const CommRecord& r = nodes[i]->collective;
      ProcessGroup& g = groups(r.members);
      // Collectives only: each synchronous call starts together on its group, so its time is its
      // own, not the skew the last call (or this rank's digest of it) left behind. With compute,
      // none: the step runs as it ran.
      const bool point_to_point = r.collective == "send" || r.collective == "recv" || r.posted();
      if (!point_to_point && !issued[0].later && !o.compute) g.barrier("replay_sync");
      const auto t0 = std::chrono::steady_clock::now();
      if (r.batch != 0) {  // one op or more
        std::vector<Work> works = g.batch_isend_irecv(batch_ops(nodes, issued));
        for (size_t k = 0; k < issued.size(); ++k) issued[k].work = std::move(works[k]);
      } else {
        issued[0].work =
            issue_call(g, r, issued[0].in, issued[0].out, o.scale_bytes, issued[0].later,
                       where_of(*nodes[i]));
      }
      for (CallToReplay& x : issued) {
        if (x.later) {  // timed from its issue to its wait's return, at its wait node (or the end)
          pending[x.call.node_id] = {std::move(x.work), t0, timed.size(),
                                     x.writes ? x.out : Tensor()};
          timed.push_back(std::move(x.call));
          buffers.release_after(x.node);  // the Work keeps its buffers until it completes
          continue;
        }
        x.work.wait();  // a batch's op (synchronous ones return completed Works)
        if (!o.compute) runtime::synchronize(device);  // a GPU's call has run, for its time
        x.call.replayed_us = micros_since(t0);
        if (x.writes) absorb(x.out);
        timed.push_back(std::move(x.call));
        buffers.release_after(x.node);
      }
      i = last_node;
    }
    while (!pending.empty()) complete(pending.begin());  // waited for after the step
    runtime::synchronize(device);
    const double step_us = micros_since(step_start) - digest_us;
    for (const Tensor& sum : written_sums) digest = mix(digest, sum.item<double>());
    if (last) {
      result.calls = std::move(timed);
      result.ops = std::move(ops);
      result.digest = digest;
      result.peak_bytes = runtime::memory_stats(device).peak_bytes_in_use - before;
      result.replayed_step_us = step_us;
    }
  }
  return result;
}

std::string replay_table(const ReplayResult& result, int64_t world_size) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%6s %-20s %-26s %12s %12s %12s %10s\n", "node", "collective",
                "name", "bytes", "recorded(us)", "replayed(us)", "busbw GB/s");
  out += line;
  double recorded = 0, replayed = 0;
  for (const ReplayedCall& c : result.calls) {
    CommRecord r;
    r.collective = c.collective;
    r.group_size = int(c.members.size());
    r.size_bytes = c.size_bytes;
    r.end_us = c.replayed_us;
    char busbw[32] = "-";  // a deferred call's time includes what overlapped it
    if (!c.deferred) std::snprintf(busbw, sizeof busbw, "%.3f", r.busbw() / 1e9);
    std::snprintf(line, sizeof line, "%6lld %-20s %-26s %12lld %12.1f %12.1f %10s%s\n",
                  (long long)c.node_id, c.collective.c_str(), c.name.c_str(),
                  (long long)c.size_bytes, c.recorded_us, c.replayed_us, busbw,
                  c.deferred ? "  (deferred: issue to wait)" : "");
    out += line;
    recorded += c.recorded_us;
    replayed += c.replayed_us;
  }
  std::snprintf(line, sizeof line,
                "%zu collectives on %lld ranks: recorded %.1f us, replayed %.1f us; peak %.2f MiB "
                "of replay buffers; output digest %016llx\n",
                result.calls.size(), (long long)world_size, recorded, replayed,
                double(result.peak_bytes) / double(1 << 20), (unsigned long long)result.digest);
  out += line;
  std::snprintf(line, sizeof line,
                "step (first issue to last end): recorded %.3f ms, replayed %.3f ms\n",
                result.recorded_step_us / 1e3, result.replayed_step_us / 1e3);
  out += line;
  return out;
}

std::string replay_ops_table(const ReplayResult& result) {
  struct Total {
    int64_t calls = 0, skipped = 0;
    double recorded_us = 0, replayed_us = 0;
    std::string reason;
  };
  std::map<std::string, Total> by_name;
  double recorded = 0, replayed = 0;
  int64_t skipped = 0;
  for (const ReplayedOp& op : result.ops) {
    Total& t = by_name[op.name];
    t.calls += 1;
    if (!op.skipped.empty()) {
      t.skipped += 1;
      t.reason = op.skipped;
      skipped += 1;
      continue;
    }
    t.recorded_us += op.recorded_us;
    t.replayed_us += op.replayed_us;
    recorded += op.recorded_us;
    replayed += op.replayed_us;
  }
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-40s %8s %14s %14s\n", "kernel", "calls", "recorded(ms)",
                "replayed(ms)");
  out += line;
  for (const auto& [name, t] : by_name) {
    if (t.skipped == t.calls) continue;
    std::snprintf(line, sizeof line, "%-40s %8lld %14.3f %14.3f\n", name.c_str(),
                  (long long)(t.calls - t.skipped), t.recorded_us / 1e3, t.replayed_us / 1e3);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "%lld kernels re-run: recorded %.3f ms, replayed %.3f ms; %lld skipped\n",
                (long long)(int64_t(result.ops.size()) - skipped), recorded / 1e3, replayed / 1e3,
                (long long)skipped);
  out += line;
  for (const auto& [name, t] : by_name) {
    if (t.skipped == 0) continue;
    out += "  skipped " + std::to_string(t.skipped) + " x " + name + ": " + t.reason + "\n";
  }
  return out;
}

}  // namespace mt::parallel
