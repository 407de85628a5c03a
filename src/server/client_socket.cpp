#include "src/server/client_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <vector>

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

// The process's open descriptors (/proc/self/fd), not every number up to
// the limit: a server has tens open and a limit of up to 2^20.
std::vector<int> open_descriptors() {
  std::vector<int> fds;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (*end == '\0') fds.push_back((int)fd);
  }
  return fds;
}

}  // namespace

void widen_listen_backlog(int port) {
  for (int fd : open_descriptors())
    if (listening(fd) && local_end(fd).port == port) ::listen(fd, SOMAXCONN);
}

int find_connection(int local_port, const std::string& remote_addr, int remote_port) {
  for (int fd : open_descriptors()) {
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
