// mt_embedding_server: the serving replica of streamed embedding rows (parallel/embedding/
// row_stream_server.h, docs/embedding_streaming.md), and a tiny lookup client.
//
//   mt_embedding_server --db DIR --port N [--bind HOST]
//       receives the UPDATE frames of trainers run with [embedding] stream_to = "host:N" into the
//       kv store DIR (kept across restarts) and answers lookups, until SIGINT or SIGTERM.
//       --port 0 picks a free port; the "serving" line says which.
//   mt_embedding_server --lookup HOST:PORT --table NAME --ids 1,2,3 [--timeout S]
//       prints the rows of NAME from a running replica, one per line ("id: v0 v1 ...", values
//       with enough digits to read back bitwise; "id: not stored" for rows never streamed).
// Exit status: 0, or 2 with a message on stderr for bad flags and failures.
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "parallel/embedding/row_stream.h"
#include "parallel/embedding/row_stream_server.h"
#include "runtime/core/error.h"
#include "tools/flags.h"

namespace {

using namespace mt;

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

constexpr const char* kUsage =
    "usage:\n"
    "  mt_embedding_server --db DIR --port N [--bind HOST]\n"
    "      serve streamed embedding rows from the kv store DIR on port N (0: a free one)\n"
    "      until SIGINT/SIGTERM; --bind 127.0.0.1 for loopback only (default 0.0.0.0)\n"
    "  mt_embedding_server --lookup HOST:PORT --table NAME --ids 1,2,3 [--timeout S]\n"
    "      print rows of a table from a running replica\n"
    "A trainer streams to it with [embedding] stream_to = \"host:port\" "
    "(docs/embedding_streaming.md).\n";

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  size_t start = 0;
  MT_CHECK(!text.empty(), "mt_embedding_server: --ids is empty (expected e.g. 1,2,3)");
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    MT_CHECK(!item.empty() && *end == '\0' && errno == 0, "mt_embedding_server: --ids '", text,
             "': '", item, "' is not an integer row id (expected e.g. 1,2,3)");
    ids.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

template <class T>
void print_row(const T* row, int64_t dim) {
  std::cout << std::setprecision(std::numeric_limits<T>::max_digits10);
  for (int64_t j = 0; j < dim; ++j) std::cout << ' ' << row[j];
}

int run(int argc, char** argv) {
  std::string db, lookup, table, ids_text, bind = "0.0.0.0";
  int64_t port = -1;
  bool port_given = false;
  double timeout = 10;
  tools::FlagReader flags("mt_embedding_server", argc, argv);
  while (flags.next()) {
    if (flags.is("--help") || flags.is("-h")) {
      std::cout << kUsage;
      return 0;
    } else if (flags.is("--db")) {
      db = flags.value();
    } else if (flags.is("--port")) {
      port = flags.int_value();
      port_given = true;
    } else if (flags.is("--bind")) {
      bind = flags.value();
    } else if (flags.is("--lookup")) {
      lookup = flags.value();
    } else if (flags.is("--table")) {
      table = flags.value();
    } else if (flags.is("--ids")) {
      ids_text = flags.value();
    } else if (flags.is("--timeout")) {
      timeout = flags.double_value();
      MT_CHECK(timeout > 0, "mt_embedding_server: --timeout must be positive, got ", timeout);
    } else {
      flags.unknown();
    }
  }

  if (!lookup.empty()) {
    MT_CHECK(db.empty() && !port_given, "mt_embedding_server: --lookup is a client: it takes no ",
             "--db or --port (see --help)");
    MT_CHECK(!table.empty(), "mt_embedding_server: --lookup needs --table NAME");
    MT_CHECK(!ids_text.empty(), "mt_embedding_server: --lookup needs --ids (e.g. --ids 1,2,3)");
    const parallel::StreamAddress address = parallel::parse_stream_address(lookup);
    const std::vector<int64_t> ids = parse_ids(ids_text);
    const parallel::row_stream::LookupResult r =
        parallel::lookup_remote(address, table, ids, timeout);
    const int64_t dim = r.values.size(1);
    std::cout << "table " << table << ": " << ids.size() << " ids, embedding_dim " << dim << " "
              << runtime::dtype_name(r.values.dtype()) << "\n";
    for (size_t i = 0; i < ids.size(); ++i) {
      std::cout << ids[i] << ":";
      if (!r.found[i]) {
        std::cout << " not stored\n";
        continue;
      }
      if (r.values.dtype() == runtime::DType::F64)
        print_row(r.values.data<double>() + int64_t(i) * dim, dim);
      else
        print_row(r.values.data<float>() + int64_t(i) * dim, dim);
      std::cout << "\n";
    }
    return 0;
  }

  MT_CHECK(table.empty() && ids_text.empty(), "mt_embedding_server: --table and --ids go with ",
           "--lookup HOST:PORT (see --help)");
  MT_CHECK(!db.empty(),
           "mt_embedding_server: give --db DIR to serve, or --lookup HOST:PORT "
           "(see --help)");
  MT_CHECK(port_given, "mt_embedding_server: --port N is required (0 picks a free port)");
  MT_CHECK(port >= 0 && port <= 65535, "mt_embedding_server: --port ", port,
           " is not from 0 to 65535");
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  parallel::RowStreamServer server(parallel::RowStreamServerOptions{
      .db = db, .port = int(port), .bind_host = bind, .log = &std::cerr});
  std::cout << "mt_embedding_server: serving " << db << " on " << bind << ":" << server.port()
            << std::endl;
  while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.stop();
  const parallel::RowStreamServerStats s = server.stats();
  std::cout << "mt_embedding_server: stopped (signal " << int(g_signal)
            << "): " << s.updates_applied << " updates (" << s.rows_applied << " rows) applied, "
            << s.updates_refused << " refused, " << s.bad_frames << " bad frames, " << s.lookups
            << " lookups, " << s.connections_accepted << " connections" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
