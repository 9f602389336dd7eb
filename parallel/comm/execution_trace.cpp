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
  for (const runtime::ProfiledOp& op : ops.ops) {
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
    trace.nodes.push_back(std::move(n));
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
    trace.nodes.push_back(n);
    if (r.posted() && r.waited_us > 0) {  // and where the step waited for it (after the post,
      TraceNode& wait = trace.nodes.emplace_back(std::move(n));  // also at the same microsecond)
      wait.type = TraceNode::Type::Wait;
      wait.name = "wait";
      wait.thread = "main";
      wait.issued_us = std::max(r.waited_us, r.issued_us) - origin;
      wait.dur_us = r.end_us - r.waited_us;
    }
  }
  std::stable_sort(
      trace.nodes.begin(), trace.nodes.end(),
      [](const TraceNode& a, const TraceNode& b) { return a.issued_us < b.issued_us; });
  std::map<int64_t, int64_t> posted_node;  // a posted message's issue number -> its node id
  for (size_t i = 0; i < trace.nodes.size(); ++i) {
    TraceNode& n = trace.nodes[i];
    n.id = int64_t(i) + 1;
    if (n.type == TraceNode::Type::Collective) posted_node[n.collective.issue] = n.id;
    if (n.type == TraceNode::Type::Wait) n.waits_for = posted_node.at(n.collective.issue);
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
