#include "src/server/client_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace topkv::server {

namespace {

// The address and port of one end of a socket, or port -1.
struct End {
  std::string addr;
  int port = -1;
};

End end_of(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  End e;
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    e.port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    e.port = ntohs(v6->sin6_port);
  }
  e.addr = text;
  return e;
}

End local_end(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? end_of(a) : End{};
}

End remote_end(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  return getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? end_of(a) : End{};
}

bool listening(int fd) {
  int on = 0;
  socklen_t len = sizeof(on);
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on;
}

// Descriptors worth trying: up to the process's limit, at most 65536.
int descriptor_limit() {
  struct rlimit lim {};
  return getrlimit(RLIMIT_NOFILE, &lim) == 0 ? (int)std::min<rlim_t>(lim.rlim_cur, 65536) : 1024;
}

}  // namespace

void widen_listen_backlog(int port) {
  const int most = descriptor_limit();
  for (int fd = 0; fd < most; ++fd)
    if (listening(fd) && local_end(fd).port == port) ::listen(fd, SOMAXCONN);
}

int find_connection(int local_port, const std::string& remote_addr, int remote_port) {
  const int most = descriptor_limit();
  for (int fd = 0; fd < most; ++fd) {
    if (listening(fd) || local_end(fd).port != local_port) continue;
    const End peer = remote_end(fd);
    if (peer.port == remote_port && peer.addr == remote_addr) return fd;
  }
  return -1;
}

bool peer_closed(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;  // end of file: the client closed its side
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace topkv::server
