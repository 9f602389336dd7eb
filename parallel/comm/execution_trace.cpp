// Execution traces: merging a profiled step with its collectives, and the JSON file.
#include "parallel/comm/execution_trace.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/core/error.h"

namespace mt::parallel {

namespace {

// The profiler's entries for collectives (ProcessGroup records each call as an op of its own).
bool is_collective_op(const char* name) {
  static const std::set<std::string> names = {"all_reduce",
                                              "all_gather_into",
                                              "reduce_scatter_into",
                                              "all_to_all_single",
                                              "broadcast",
                                              "barrier",
                                              "send",
                                              "recv"};
  return names.count(name) > 0;
}

std::string device_text(runtime::Device d) {
  std::ostringstream os;
  os << d;
  return os.str();
}

nlohmann::json tensors_json(const std::vector<runtime::TensorMeta>& tensors) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : tensors) {
    out.push_back({{"storage", t.storage},
                   {"shape", t.shape},
                   {"strides", t.strides},
                   {"offset", t.offset},
                   {"dtype", t.dtype},
                   {"bytes", t.bytes}});
  }
  return out;
}

std::vector<runtime::TensorMeta> tensors_from(const nlohmann::json& j) {
  std::vector<runtime::TensorMeta> out;
  for (const auto& e : j) {
    runtime::TensorMeta t;
    e.at("storage").get_to(t.storage);
    e.at("shape").get_to(t.shape);
    if (e.contains("strides")) {  // schema 2
      e.at("strides").get_to(t.strides);
      e.at("offset").get_to(t.offset);
    }
    e.at("dtype").get_to(t.dtype);
    e.at("bytes").get_to(t.bytes);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

ExecutionTrace make_execution_trace(const runtime::ProfileReport& ops,
                                    const std::vector<CommRecord>& collectives, int rank,
                                    int world_size, int64_t step) {
  ExecutionTrace trace;
  trace.rank = rank;
  trace.world_size = world_size;
  trace.step = step;
  const double origin = ops.wall_start_us;
  // Nodes are placed by the kernels recorded before them (a kernel: its index among every
  // recorded kernel; a collective or wait: the kernels recorded on its thread before it, or,
  // issued elsewhere, those begun before its time), then by time, then the call before its wait.
  // Timestamps alone would not do: a kernel that ends a microsecond before a collective it feeds
  // may carry a later time (two clocks, each to the microsecond).
  struct Key {
    int64_t ops_before;
    int kind;  // 0: a collective or wait; 1: a kernel
    double time;
    int64_t issue;
    int wait;
    auto operator<=>(const Key&) const = default;
  };
  std::vector<std::pair<Key, TraceNode>> keyed;
  std::vector<double> op_begins;  // every recorded kernel's begin, for events from other threads
  for (size_t j = 0; j < ops.ops.size(); ++j) {
    const runtime::ProfiledOp& op = ops.ops[j];
    op_begins.push_back(op.host_begin_us);
    if (op.depth != 0 || is_collective_op(op.name)) continue;
    TraceNode n;
    n.type = TraceNode::Type::Op;
    n.name = op.name;
    n.thread = "main";
    n.device = device_text(op.device);
    n.issued_us = op.host_begin_us;
    n.dur_us = op.host_end_us - op.host_begin_us;
    n.inputs = op.inputs;
    n.outputs = op.outputs;
    n.args = op.args;
    keyed.push_back({{int64_t(j), 1, n.issued_us, 0, 0}, std::move(n)});
  }
  const auto place = [&](int64_t ops_before, double rel_us) {
    if (ops_before >= 0) return ops_before;
    return int64_t(std::upper_bound(op_begins.begin(), op_begins.end(), rel_us) -
                   op_begins.begin());
  };
  // The ops of one batch_isend_irecv stay together, in issue order, where its first op was
  // issued: a replay posts them as one batch again (a wait node between them would split it).
  struct BatchStart {
    int64_t issue, ops_before;
    double time;
  };
  std::map<int64_t, BatchStart> batch_start;
  for (const CommRecord& r : collectives) {
    if (r.issued_us < origin || r.batch == 0) continue;
    const double rel = r.issued_us - origin;
    auto [it, fresh] = batch_start.try_emplace(r.batch, BatchStart{r.issue, 0, rel});
    if (fresh || r.issue < it->second.issue) it->second = {r.issue, place(r.ops_before, rel), rel};
  }
  for (const CommRecord& r : collectives) {
    if (r.issued_us < origin) continue;  // the step before's tail
    TraceNode n;
    n.type = TraceNode::Type::Collective;
    n.name = r.collective;
    n.thread = r.async ? "comm " + r.group : "main";
    n.device = device_text(ops.device);
    n.issued_us = r.issued_us - origin;
    n.dur_us = r.end_us - r.start_us;
    n.collective = r;
    Key key{place(r.ops_before, n.issued_us), 0, n.issued_us, r.issue, 0};
    if (r.batch != 0) {
      const BatchStart& b = batch_start.at(r.batch);
      key.ops_before = b.ops_before;
      key.time = b.time;
    }
    keyed.push_back({key, n});
    if ((r.posted() || r.async) && r.waited_us > 0) {  // and where the step waited for it
      TraceNode wait = std::move(n);
      wait.type = TraceNode::Type::Wait;
      wait.name = "wait";
      wait.thread = "main";
      wait.issued_us = std::max(r.waited_us, r.issued_us) - origin;
      wait.dur_us = std::max(0.0, r.end_us - r.waited_us);  // 0: it had finished
      const Key key{std::max(place(r.ops_before_wait, wait.issued_us), keyed.back().first.ops_before),
                    0, wait.issued_us, r.issue, 1};
      keyed.push_back({key, std::move(wait)});
    }
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::map<int64_t, int64_t> node_of;  // a collective's issue number -> its node id
  for (auto& [key, n] : keyed) {
    n.id = int64_t(trace.nodes.size()) + 1;
    if (n.type == TraceNode::Type::Collective) node_of[n.collective.issue] = n.id;
    if (n.type == TraceNode::Type::Wait) n.waits_for = node_of.at(n.collective.issue);
    trace.nodes.push_back(std::move(n));
  }
  return trace;
}

void write_execution_trace(const ExecutionTrace& trace, const std::string& path) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const TraceNode& n : trace.nodes) {
    nlohmann::json j;
    if (n.type == TraceNode::Type::Collective) {
      j = nlohmann::json::parse(comm_record_json(n.collective, trace.step, trace.rank));
    } else if (n.type == TraceNode::Type::Wait) {
      j = {{"type", "wait"}, {"name", n.name}, {"waits_for", n.waits_for}};
    } else {
      j = {{"type", "op"},
           {"name", n.name},
           {"inputs", tensors_json(n.inputs)},
           {"outputs", tensors_json(n.outputs)},
           {"args", n.args}};
    }
    j["id"] = n.id;  // a collective's "name" is its caller's; "collective" is its kind
    j["thread"] = n.thread;
    j["device"] = n.device;
    j["issued_rel_us"] = n.issued_us;
    j["dur_us"] = n.dur_us;
    nodes.push_back(std::move(j));
  }
  const nlohmann::json doc = {{"schema", kExecutionTraceSchema},
                              {"format", "minititan execution trace"},
                              {"rank", trace.rank},
                              {"world_size", trace.world_size},
                              {"step", trace.step},
                              {"nodes", nodes}};
  std::ofstream f(path);
  MT_CHECK(f.good(), "execution trace: cannot write ", path);
  f << doc.dump(1) << "\n";
  MT_CHECK(f.good(), "execution trace: writing ", path, " failed");
}

ExecutionTrace read_execution_trace(const std::string& path) {
  std::ifstream f(path);
  MT_CHECK(f.good(), "execution trace: cannot read ", path);
  ExecutionTrace trace;
  try {
    const nlohmann::json doc = nlohmann::json::parse(f);
    MT_CHECK(doc.is_object() && doc.value("format", "") == "minititan execution trace", path,
             ": not a minititan execution trace");
    const int schema = doc.at("schema").get<int>();
    MT_CHECK(schema >= 1 && schema <= kExecutionTraceSchema, path, ": execution trace schema ",
             schema, ", this build reads 1 to ", kExecutionTraceSchema);
    trace.schema = schema;
    doc.at("rank").get_to(trace.rank);
    doc.at("world_size").get_to(trace.world_size);
    doc.at("step").get_to(trace.step);
    for (const auto& j : doc.at("nodes")) {
      TraceNode n;
      const std::string type = j.at("type").get<std::string>();
      const std::string where = path + ", node " + std::to_string(trace.nodes.size() + 1);
      if (type == "collective") {
        n.type = TraceNode::Type::Collective;
        n.collective = parse_comm_trace_line(j.dump(), where).collective.record;
        n.name = n.collective.collective;
      } else if (type == "wait") {
        n.type = TraceNode::Type::Wait;
        j.at("name").get_to(n.name);
        j.at("waits_for").get_to(n.waits_for);
      } else {
        MT_CHECK(type == "op", where, ": unknown node type '", type, "'");
        j.at("name").get_to(n.name);
        n.inputs = tensors_from(j.at("inputs"));
        n.outputs = tensors_from(j.at("outputs"));
        if (schema >= 2) j.at("args").get_to(n.args);
      }
      j.at("id").get_to(n.id);
      j.at("thread").get_to(n.thread);
      j.at("device").get_to(n.device);
      j.at("issued_rel_us").get_to(n.issued_us);
      j.at("dur_us").get_to(n.dur_us);
      trace.nodes.push_back(std::move(n));
    }
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL(path, ": not a readable execution trace (", e.what(), ")");
  }
  return trace;
}

}  // namespace mt::parallel
