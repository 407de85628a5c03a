// The server's sockets as the operating system sees them: what Debian's
// compiled cpp-httplib (0.11) does not expose. Linux only.
#pragma once
#include <string>

namespace topkv::server {

// Raises the listen backlog of the socket listening on `port` to SOMAXCONN.
// The library listens with its compiled-in backlog of 5: a burst of clients
// on a loaded machine overflows it and some see their connection reset.
// listen() on a listening socket sets its backlog again (POSIX; Linux takes
// the new value).
void widen_listen_backlog(int port);

// The descriptor of the connection from `remote_addr`:`remote_port` to this
// server's `local_port` (as httplib::Request names its peer), or -1. The
// connection stays open while its request is handled, so the descriptor
// cannot be reused meanwhile.
int find_connection(int local_port, const std::string& remote_addr, int remote_port);

// Whether the peer of connection `fd` has closed it (a read would return
// end of file) or it is in error. Reads nothing: it peeks.
bool peer_closed(int fd);

}  // namespace topkv::server
