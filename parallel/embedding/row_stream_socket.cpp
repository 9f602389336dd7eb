#include "parallel/embedding/row_stream_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "runtime/core/error.h"

namespace mt::parallel::row_stream::net {

namespace {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline`, for poll (-1: no deadline).
int remaining_ms(bool has_deadline, Clock::time_point deadline) {
  if (!has_deadline) return -1;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : int(left);
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

int connect_tcp(const std::string& host, int port, double timeout_s, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    *error = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return -1;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000.0 + 0.5));
  int result = -1;
  for (addrinfo* a = found; a && result < 0; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      *error = "socket: " + errno_text(errno);
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        *error = errno_text(errno);
        close(fd);
        continue;
      }
      pollfd p{fd, POLLOUT, 0};
      const int n = poll(&p, 1, remaining_ms(true, deadline));
      int so_error = 0;
      socklen_t len = sizeof(so_error);
      if (n <= 0) {
        *error = n == 0 ? "connect timed out" : errno_text(errno);
        close(fd);
        continue;
      }
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error != 0) {
        *error = errno_text(so_error ? so_error : errno);
        close(fd);
        continue;
      }
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    result = fd;
  }
  freeaddrinfo(found);
  return result;
}

int listen_tcp(const std::string& host, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  MT_CHECK(rc == 0, "embedding server: cannot resolve '", host, "': ", gai_strerror(rc));
  const int fd = socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(found);
    MT_FAIL("embedding server: socket: ", errno_text(errno));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int bind_rc = bind(fd, found->ai_addr, found->ai_addrlen);
  const int bind_errno = errno;
  freeaddrinfo(found);
  if (bind_rc != 0 || listen(fd, 64) != 0) {
    const int err = bind_rc != 0 ? bind_errno : errno;
    close(fd);
    MT_FAIL("embedding server: cannot listen on ", host, ":", port, ": ", errno_text(err),
            err == EADDRINUSE ? " (another process uses the port: choose another --port)" : "");
  }
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound_port = ntohs(addr.sin_port);
  return fd;
}

bool send_all(int fd, const void* data, size_t size, int timeout_ms, std::string* error) {
  const bool has_deadline = timeout_ms >= 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      const int r = poll(&pf, 1, remaining_ms(has_deadline, deadline));
      if (r == 0) {
        *error = "send timed out";
        return false;
      }
      if (r < 0 && errno != EINTR) {
        *error = errno_text(errno);
        return false;
      }
      continue;
    }
    *error = errno_text(errno);
    return false;
  }
  return true;
}

RecvStatus recv_exact(int fd, void* data, size_t size, int timeout_ms, size_t* received,
                      std::string* error) {
  const bool has_deadline = timeout_ms >= 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  char* p = static_cast<char*>(data);
  size_t got = 0;
  *received = 0;
  while (got < size) {
    const ssize_t n = recv(fd, p + got, size - got, MSG_DONTWAIT);
    if (n > 0) {
      got += size_t(n);
      *received = got;
      continue;
    }
    if (n == 0) return RecvStatus::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pf{fd, POLLIN, 0};
      const int r = poll(&pf, 1, remaining_ms(has_deadline, deadline));
      if (r == 0) {
        *error = "receive timed out";
        return RecvStatus::Timeout;
      }
      if (r < 0 && errno != EINTR) {
        *error = errno_text(errno);
        return RecvStatus::Error;
      }
      continue;
    }
    *error = errno_text(errno);
    return RecvStatus::Error;
  }
  return RecvStatus::Ok;
}

std::string peer_name(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "(unknown peer)";
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(addr.sin_port));
}

void close_fd(int fd) {
  if (fd >= 0) close(fd);
}

}  // namespace mt::parallel::row_stream::net
