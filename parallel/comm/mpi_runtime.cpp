// The MPI library's lifetime, polled waits, and the monitor (peer queries, watched deadlines).
#include "parallel/comm/mpi_runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"

namespace mt::parallel::mpi {

namespace {

constexpr int kQueryTag = 1;
constexpr int kReplyTag = 2;

// A CollectiveRecord on the wire (MPI_BYTE). seq = -1: the rank has no such group (anymore).
struct WireRecord {
  int64_t seq = -1;
  int32_t running = 0;
  char collective[32] = {};
  char name[92] = {};
};

void copy_text(char* dst, size_t n, const std::string& src) {
  std::memset(dst, 0, n);
  std::memcpy(dst, src.data(), std::min(n - 1, src.size()));
}

class Runtime {
 public:
  Runtime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Query_thread(&thread_level_);
    } else if (MpiProcessGroup::launched_by_launcher()) {
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level_);
      initialized_here_ = true;
    } else {
      return;  // no launcher: the local single-process world
    }
    // Blocking calls on several threads (each group's communication thread, the monitor) need it.
    MT_CHECK(thread_level_ >= MPI_THREAD_MULTIPLE,
             "MpiProcessGroup: the MPI library provides thread level ", thread_level_,
             " but minititan needs MPI_THREAD_MULTIPLE (", int(MPI_THREAD_MULTIPLE),
             "): OpenMPI >= 3 and MPICH provide it unless built without thread support");
    MPI_Comm_dup(MPI_COMM_WORLD, &monitor_comm_);
    MPI_Comm_set_errhandler(monitor_comm_, MPI_ERRORS_RETURN);
    active_ = true;
    monitor_ = std::thread([this] { monitor_loop(); });
  }

  ~Runtime() {
    if (monitor_.joinable()) {
      stop_ = true;
      monitor_.join();
    }
    if (finalized()) return;
    if (monitor_comm_ != MPI_COMM_NULL) MPI_Comm_free(&monitor_comm_);
    if (initialized_here_) MPI_Finalize();
  }

  bool active() const { return active_; }
  MPI_Comm monitor_comm() const { return monitor_comm_; }

  int64_t agree_uid(MPI_Comm comm) {
    int64_t mine = 0;
    {
      std::lock_guard g(registry_mutex_);
      mine = next_uid_;
    }
    int64_t agreed = 0;
    int rc = MPI_Allreduce(&mine, &agreed, 1, MPI_INT64_T, MPI_MAX, comm);
    MT_CHECK(rc == MPI_SUCCESS, "MpiProcessGroup: agreeing on a group id failed: ",
             error_string(rc));
    std::lock_guard g(registry_mutex_);
    next_uid_ = std::max(next_uid_, agreed + 1);
    return agreed;
  }

  void add(int64_t uid, const ProcessGroup* group) {
    std::lock_guard g(registry_mutex_);
    groups_[uid] = group;
  }
  void remove(int64_t uid) {
    std::lock_guard g(registry_mutex_);
    groups_.erase(uid);
  }

  int64_t watch(Clock::time_point deadline, std::function<void()> on_timeout) {
    std::lock_guard g(watch_mutex_);
    watched_[next_watch_] = {deadline, std::move(on_timeout)};
    return next_watch_++;
  }
  void unwatch(int64_t id) {
    std::lock_guard g(watch_mutex_);
    watched_.erase(id);
  }

 private:
  WireRecord record_of(int64_t uid) {
    WireRecord w;
    std::lock_guard g(registry_mutex_);
    auto it = groups_.find(uid);
    if (it == groups_.end()) return w;
    CollectiveRecord r = it->second->last_collective();
    w.seq = r.seq;
    w.running = r.running ? 1 : 0;
    copy_text(w.collective, sizeof w.collective, r.collective);
    copy_text(w.name, sizeof w.name, r.name);
    return w;
  }

  // Starts the report of every watched call past its deadline, once, on a thread of its own (the
  // report asks the peers where they are, which takes a while; this thread keeps answering).
  void fire_expired() {
    std::lock_guard g(watch_mutex_);
    const Clock::time_point now = Clock::now();
    for (auto& [id, call] : watched_) {
      if (call.on_timeout && now >= call.deadline) {
        std::thread(std::move(call.on_timeout)).detach();
        call.on_timeout = nullptr;
      }
    }
  }

  // Answers queries and checks deadlines every 20 ms; the replies are small (eager) sends.
  void monitor_loop() {
    while (!stop_) {
      fire_expired();
      int flag = 0;
      {
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, monitor_comm_, &flag, &status);
        if (flag) {
          int64_t uid = 0;
          MPI_Recv(&uid, 1, MPI_INT64_T, status.MPI_SOURCE, kQueryTag, monitor_comm_,
                   MPI_STATUS_IGNORE);
          WireRecord reply = record_of(uid);
          MPI_Send(&reply, int(sizeof reply), MPI_BYTE, status.MPI_SOURCE, kReplyTag,
                   monitor_comm_);
        }
      }
      if (!flag) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  bool active_ = false;
  bool initialized_here_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  MPI_Comm monitor_comm_ = MPI_COMM_NULL;
  std::mutex registry_mutex_;
  std::map<int64_t, const ProcessGroup*> groups_;
  int64_t next_uid_ = 1;
  struct Watched {
    Clock::time_point deadline;
    std::function<void()> on_timeout;  // null once started
  };
  std::mutex watch_mutex_;
  std::map<int64_t, Watched> watched_;
  int64_t next_watch_ = 0;
  std::atomic<bool> stop_{false};
  std::thread monitor_;
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

}  // namespace

bool active() { return runtime().active(); }

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

std::string error_string(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, size_t(len));
}

int64_t agree_group_uid(MPI_Comm comm) { return runtime().agree_uid(comm); }

void register_group(int64_t uid, const ProcessGroup* group) { runtime().add(uid, group); }
void unregister_group(int64_t uid) { runtime().remove(uid); }

WatchedCall::WatchedCall(Clock::time_point deadline, std::function<void()> on_timeout) {
  if (deadline != Clock::time_point::max()) id_ = runtime().watch(deadline, std::move(on_timeout));
}

WatchedCall::~WatchedCall() {
  if (id_ >= 0) runtime().unwatch(id_);
}

int wait_until(std::vector<MPI_Request>& requests, std::vector<MPI_Status>* statuses,
               Clock::time_point deadline) {
  std::vector<MPI_Status> local;
  if (!statuses) statuses = &local;
  statuses->resize(requests.size());
  auto pause = std::chrono::microseconds(20);
  for (int polls = 0;; ++polls) {
    int done = 0;
    int rc = MPI_Testall(int(requests.size()), requests.data(), &done, statuses->data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& s : *statuses) {
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) return s.MPI_ERROR;
      }
    }
    if (rc != MPI_SUCCESS) return rc;
    if (done) return MPI_SUCCESS;
    if (Clock::now() >= deadline) return kTimedOut;
    // Spin (yielding) briefly for fast collectives, then back off to at most 0.5 ms between polls.
    if (polls < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(500));
    }
  }
}

void query_peers(int64_t uid, std::vector<PeerRecord>& peers, Clock::time_point deadline) {
  const MPI_Comm comm = runtime().monitor_comm();
  std::vector<int64_t> query(peers.size(), uid);
  std::vector<WireRecord> replies(peers.size());
  std::vector<MPI_Request> sends(peers.size()), recvs(peers.size());
  {
    for (size_t i = 0; i < peers.size(); ++i) {
      MPI_Irecv(&replies[i], int(sizeof(WireRecord)), MPI_BYTE, peers[i].world_rank, kReplyTag,
                comm, &recvs[i]);
      MPI_Isend(&query[i], 1, MPI_INT64_T, peers[i].world_rank, kQueryTag, comm, &sends[i]);
    }
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    std::vector<MPI_Request> one{recvs[i]};
    peers[i].record.reset();
    if (wait_until(one, nullptr, deadline) != MPI_SUCCESS) continue;
    CollectiveRecord r;
    r.seq = replies[i].seq;
    r.running = replies[i].running != 0;
    r.collective = replies[i].collective;
    r.name = replies[i].name;
    peers[i].record = r;
  }
  // The job ends right after this: requests still pending (dead peers) are left as they are.
}

void abort_job(const std::string& message) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr, "[rank %d] %s\n", world_rank, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 124);
  std::_Exit(124);  // MPI_Abort does not return; this is for libraries that do
}

}  // namespace mt::parallel::mpi
