// TCP helpers of the row stream (row_stream.h, row_stream_server.h): connect with a timeout,
// listen, and whole-buffer sends and receives with deadlines. POSIX sockets, IPv4; SIGPIPE is
// never raised (MSG_NOSIGNAL). Internal to parallel/embedding.
#pragma once

#include <cstddef>
#include <string>

namespace mt::parallel::row_stream::net {

// A connected TCP socket (non-blocking, TCP_NODELAY, close-on-exec), or -1 with `error` set.
int connect_tcp(const std::string& host, int port, double timeout_s, std::string* error);

// A listening socket on host:port (port 0: a free one, written to *bound_port); mt::Error on
// failure, naming the address.
int listen_tcp(const std::string& host, int port, int* bound_port);

// Sends all `size` bytes (waiting with poll on a non-blocking socket); false on an error or
// when timeout_ms (< 0: none) passes, with `error` set.
bool send_all(int fd, const void* data, size_t size, int timeout_ms, std::string* error);

enum class RecvStatus { Ok, Closed, Error, Timeout };
// Receives exactly `size` bytes into `data`; *received tells how many came before a failure.
RecvStatus recv_exact(int fd, void* data, size_t size, int timeout_ms, size_t* received,
                      std::string* error);

// "a.b.c.d:port" of the socket's peer, for log lines.
std::string peer_name(int fd);

void close_fd(int fd);

}  // namespace mt::parallel::row_stream::net
