// CommTrace: the process-wide record list, exposed time, purposes, and the JSON lines.
#include "parallel/comm/comm_trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>
#include <nlohmann/json.hpp>
#include <utility>

#include "runtime/core/error.h"

namespace mt::parallel {

namespace {

std::atomic<bool> g_active{false};
std::atomic<int64_t> g_issue{0};
std::mutex g_mutex;  // guards g_records, g_waits and g_exposed_s
std::vector<CommRecord> g_records;
// Waits noted before their call's record was added: issue -> (waited_us, ops_before_wait).
std::map<int64_t, std::pair<double, int64_t>> g_waits;
double g_exposed_s = 0;
thread_local bool t_tracing_thread = false;
thread_local int t_exposed_depth = 0;  // ExposedCommScopes open on this thread
thread_local std::string t_purpose;

}  // namespace

double wall_clock_us() {
  return double(std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count());
}

bool CommRecord::has_kind() const { return collective != "barrier"; }

CollectiveKind CommRecord::kind() const {
  if (collective == "all_reduce") return CollectiveKind::AllReduce;
  if (collective == "all_gather_into") return CollectiveKind::AllGather;
  if (collective == "reduce_scatter_into") return CollectiveKind::ReduceScatter;
  if (collective == "all_to_all_single") return CollectiveKind::AllToAll;
  if (collective == "broadcast") return CollectiveKind::Broadcast;
  if (collective == "send" || collective == "recv") return CollectiveKind::SendRecv;
  if (posted()) return CollectiveKind::PostedSendRecv;
  MT_FAIL("CommRecord: '", collective, "' has no bandwidth kind");
}

bool CommRecord::posted() const { return collective == "isend" || collective == "irecv"; }

bool CommRecord::uneven() const {
  if (collective != "all_to_all_single" || send_bytes.empty()) return false;
  auto all_equal = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [&](int64_t b) { return b == v.front(); });
  };
  return !all_equal(send_bytes) || !all_equal(recv_bytes);
}

double CommRecord::algbw() const {
  if (!has_kind() || posted() || size_bytes == 0 || end_us <= start_us) return 0;
  return algbw_bytes_per_second(size_bytes, seconds());
}

double CommRecord::busbw() const {
  if (!has_kind() || posted() || uneven() || size_bytes == 0 || end_us <= start_us) return 0;
  return busbw_bytes_per_second(kind(), group_size, size_bytes, seconds());
}

AllToAllTraffic CommRecord::traffic() const {
  MT_CHECK(collective == "all_to_all_single", "CommRecord::traffic: '", collective,
           "' is not an all_to_all");
  return all_to_all_traffic(send_bytes, recv_bytes, group_rank);
}

std::string comm_record_json(const CommRecord& r, int64_t step, int rank) {
  nlohmann::json j = {{"schema", kCommTraceSchema},
                      {"type", "collective"},
                      {"step", step},
                      {"rank", rank},
                      {"issue", r.issue},
                      {"seq", r.seq},
                      {"collective", r.collective},
                      {"name", r.name},
                      {"serves", r.serves},
                      {"group", r.group},
                      {"mesh_dim", r.mesh_dim},
                      {"members", r.members},
                      {"group_rank", r.group_rank},
                      {"group_size", r.group_size},
                      {"dtype", r.dtype},
                      {"reduce_op", r.reduce_op},
                      {"peer", r.peer},
                      {"tag", r.tag},
                      {"in_shape", r.in_shape},
                      {"out_shape", r.out_shape},
                      {"in_storage", r.in_storage},
                      {"out_storage", r.out_storage},
                      {"bytes_in", r.bytes_in},
                      {"bytes_out", r.bytes_out},
                      {"size_bytes", r.size_bytes},
                      {"send_bytes", r.send_bytes},
                      {"recv_bytes", r.recv_bytes},
                      {"async", r.async},
                      {"batch", r.batch},
                      {"issued_us", r.issued_us},
                      {"start_us", r.start_us},
                      {"end_us", r.end_us},
                      {"waited_us", r.waited_us},
                      {"device_timed", r.device_timed},
                      {"algbw", r.algbw()},
                      {"busbw", r.busbw()}};
  if (r.collective == "all_to_all_single") {
    const AllToAllTraffic t = r.traffic();
    j["off_rank_sent"] = t.sent_off_rank;
    j["off_rank_received"] = t.received_off_rank;
    j["off_rank_bw"] = r.seconds() > 0 ? double(t.off_rank()) / r.seconds() : 0.0;
  }
  return j.dump();
}

std::string comm_step_json(const TracedStep& s) {
  return nlohmann::json{{"schema", kCommTraceSchema},
                        {"type", "step"},
                        {"step", s.step},
                        {"rank", s.rank},
                        {"seconds", s.seconds},
                        {"exposed_seconds", s.exposed_seconds}}
      .dump();
}

CommTraceLine parse_comm_trace_line(const std::string& line, const std::string& where) {
  CommTraceLine out;
  try {
    const nlohmann::json j = nlohmann::json::parse(line);
    MT_CHECK(j.is_object() && j.contains("schema"), where,
             ": not a communication trace record (no schema)");
    const int schema = j.at("schema").get<int>();
    MT_CHECK(schema >= 1 && schema <= kCommTraceSchema, where, ": schema ", schema,
             ", this build reads 1 to ", kCommTraceSchema);
    const std::string type = j.at("type").get<std::string>();
    if (type == "step") {
      out.is_step = true;
      j.at("step").get_to(out.step.step);
      j.at("rank").get_to(out.step.rank);
      j.at("seconds").get_to(out.step.seconds);
      j.at("exposed_seconds").get_to(out.step.exposed_seconds);
      return out;
    }
    MT_CHECK(type == "collective", where, ": unknown record type '", type, "'");
    TracedCollective& t = out.collective;
    t.step = j.at("step").get<int64_t>();
    t.rank = j.at("rank").get<int>();
    CommRecord& r = t.record;
    j.at("issue").get_to(r.issue);
    j.at("seq").get_to(r.seq);
    j.at("collective").get_to(r.collective);
    j.at("name").get_to(r.name);
    j.at("serves").get_to(r.serves);
    j.at("group").get_to(r.group);
    j.at("mesh_dim").get_to(r.mesh_dim);
    j.at("members").get_to(r.members);
    j.at("group_rank").get_to(r.group_rank);
    j.at("group_size").get_to(r.group_size);
    j.at("dtype").get_to(r.dtype);
    j.at("reduce_op").get_to(r.reduce_op);
    j.at("peer").get_to(r.peer);
    j.at("tag").get_to(r.tag);
    j.at("in_shape").get_to(r.in_shape);
    j.at("out_shape").get_to(r.out_shape);
    j.at("in_storage").get_to(r.in_storage);
    j.at("out_storage").get_to(r.out_storage);
    j.at("bytes_in").get_to(r.bytes_in);
    j.at("bytes_out").get_to(r.bytes_out);
    j.at("size_bytes").get_to(r.size_bytes);
    j.at("send_bytes").get_to(r.send_bytes);
    j.at("recv_bytes").get_to(r.recv_bytes);
    j.at("async").get_to(r.async);
    j.at("issued_us").get_to(r.issued_us);
    j.at("start_us").get_to(r.start_us);
    j.at("end_us").get_to(r.end_us);
    if (schema >= 2) j.at("waited_us").get_to(r.waited_us);
    if (schema >= 3) j.at("device_timed").get_to(r.device_timed);
    if (schema >= 4) j.at("batch").get_to(r.batch);
    MT_CHECK(r.end_us >= r.start_us, where, ": the call ends (end_us ", r.end_us,
             ") before it starts (start_us ", r.start_us, ")");
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL(where, ": not a communication trace record (", e.what(), ")");
  }
  return out;
}

void CommTrace::start() {
  MT_CHECK(!g_active.exchange(true), "CommTrace::start: a trace is already on");
  {
    std::lock_guard lock(g_mutex);
    g_records.clear();
    g_waits.clear();
    g_exposed_s = 0;
  }
  t_tracing_thread = true;
}

void CommTrace::stop() {
  g_active = false;
  t_tracing_thread = false;
  std::lock_guard lock(g_mutex);
  g_records.clear();
  g_waits.clear();
}

bool CommTrace::active() { return g_active.load(std::memory_order_relaxed); }

std::vector<CommRecord> CommTrace::take() {
  std::vector<CommRecord> out;
  {
    std::lock_guard lock(g_mutex);
    out.swap(g_records);
  }
  for (CommRecord& r : out) {
    if (!r.device_times) continue;
    if (const auto times = r.device_times->wall_us()) {
      std::tie(r.start_us, r.end_us) = *times;
      r.device_timed = true;
    }
    r.device_times.reset();
  }
  std::sort(out.begin(), out.end(),
            [](const CommRecord& a, const CommRecord& b) { return a.issue < b.issue; });
  return out;
}

double CommTrace::take_exposed_seconds() {
  std::lock_guard lock(g_mutex);
  return std::exchange(g_exposed_s, 0.0);
}

int64_t CommTrace::next_issue() { return g_issue.fetch_add(1) + 1; }

void CommTrace::add(CommRecord record) {
  if (!active()) return;
  std::lock_guard lock(g_mutex);
  if (auto it = g_waits.find(record.issue); it != g_waits.end()) {
    std::tie(record.waited_us, record.ops_before_wait) = it->second;
    g_waits.erase(it);
  }
  g_records.push_back(std::move(record));
}

void CommTrace::note_wait(int64_t issue, double waited_us, int64_t ops_before_wait) {
  if (!active()) return;
  std::lock_guard lock(g_mutex);
  for (CommRecord& r : g_records) {
    if (r.issue != issue) continue;
    if (r.waited_us == 0) std::tie(r.waited_us, r.ops_before_wait) = {waited_us, ops_before_wait};
    return;
  }
  g_waits.emplace(issue, std::pair{waited_us, ops_before_wait});  // still running: added with it
}

void CommTrace::add_exposed(double seconds) {
  if (!active() || !t_tracing_thread) return;
  std::lock_guard lock(g_mutex);
  g_exposed_s += seconds;
}

ExposedCommScope::ExposedCommScope() {
  if (!CommTrace::active() || !t_tracing_thread) return;
  nested_ = t_exposed_depth++ > 0;  // a sync call waiting on its Work: counted once, outside
  if (!nested_) start_us_ = wall_clock_us();
  entered_ = true;
}

ExposedCommScope::~ExposedCommScope() {
  if (!entered_) return;
  --t_exposed_depth;
  if (!nested_) CommTrace::add_exposed((wall_clock_us() - start_us_) / 1e6);
}

ScopedCommPurpose::ScopedCommPurpose(std::string purpose)
    : previous_(std::exchange(t_purpose, std::move(purpose))) {}

ScopedCommPurpose::~ScopedCommPurpose() { t_purpose = std::move(previous_); }

const std::string& ScopedCommPurpose::current() { return t_purpose; }

std::string rank_file_name(int rank, std::string_view extension) {
  return "rank-" + std::to_string(rank) + std::string(extension);
}

std::optional<int> rank_of_file_name(const std::string& name, std::string_view extension) {
  constexpr std::string_view prefix = "rank-";
  if (name.size() <= prefix.size() + extension.size() || !name.starts_with(prefix) ||
      !name.ends_with(extension)) {
    return std::nullopt;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - extension.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(),
                                        [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoi(digits);
}

}  // namespace mt::parallel
