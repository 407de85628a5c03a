#include "src/common/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/common/error.h"
#include "src/common/mapped_file.h"

namespace fs = std::filesystem;

namespace topkv {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// The temporaries in flight, for the fatal-signal handler: fixed slots, no
// allocation, so the handler reads them without locks.
constexpr int kTempSlots = 64;
constexpr size_t kTempPathMax = 4096;
char g_temp_paths[kTempSlots][kTempPathMax];
std::atomic<bool> g_temp_used[kTempSlots];

int claim_temp_slot(const std::string& tmp) {
  if (tmp.size() >= kTempPathMax) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    bool expect = false;
    if (g_temp_used[i].compare_exchange_strong(expect, true)) {
      std::memcpy(g_temp_paths[i], tmp.c_str(), tmp.size() + 1);
      return i;
    }
  }
  return -1;  // more than 64 at once: that one is not removed on a fatal signal
}

void release_temp_slot(int i) {
  if (i >= 0) g_temp_used[i].store(false);
}

// The mode open(O_CREAT, 0666) would give: 0666 less the umask, read without
// changing it (umask(2) sets as it reads, racing other threads).
mode_t create_mode() {
  static const mode_t mode = [] {
    mode_t mask = 022;
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("Umask:", 0) == 0) mask = (mode_t)std::strtoul(line.c_str() + 6, nullptr, 8);
    return (mode_t)(0666 & ~mask);
  }();
  return mode;
}

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

void unlink_temporaries_for_signal() {
  for (int i = 0; i < kTempSlots; ++i)
    if (g_temp_used[i].load()) ::unlink(g_temp_paths[i]);
}

namespace {

Fd open_nonblocking(const std::string& path, std::string_view what, struct stat& st) {
  TOPKV_CHECK(!path.empty(), "no {} file given (an empty path)", what);
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer forever.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  TOPKV_CHECK(fd.get() >= 0, "cannot open {} '{}': {}", what, path, std::strerror(errno));
  TOPKV_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat {} '{}': {}", what, path, std::strerror(errno));
  return fd;
}

void set_blocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

std::string read_all(int fd, const std::string& path, std::string_view what, uint64_t max_bytes, size_t hint) {
  std::string out;
  out.reserve(hint);
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    TOPKV_CHECK(n >= 0, "reading {} '{}' failed: {}", what, path, std::strerror(errno));
    if (n == 0) break;
    out.append(buf, (size_t)n);
    TOPKV_CHECK(out.size() <= max_bytes, "{} '{}' is more than {} bytes, more than a {} may have", what, path,
                max_bytes, what);
  }
  return out;
}

}  // namespace

Fd open_regular_file(const std::string& path, std::string_view what, struct stat* st_out) {
  struct stat st {};
  Fd fd = open_nonblocking(path, what, st);
  TOPKV_CHECK(S_ISREG(st.st_mode), "{} '{}' is {}, not a regular file: give the path of a file", what, path,
              kind_of(st.st_mode));
  set_blocking(fd.get());
  if (st_out) *st_out = st;
  return fd;
}

std::string read_regular_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  struct stat st {};
  Fd fd = open_regular_file(path, what, &st);
  TOPKV_CHECK((uint64_t)st.st_size <= max_bytes, "{} '{}' is {} bytes, more than the {} bytes a {} may have", what,
              path, (uint64_t)st.st_size, max_bytes, what);
  return read_all(fd.get(), path, what, max_bytes, (size_t)st.st_size);
}

std::string read_text_input(const std::string& path, std::string_view what, uint64_t max_bytes) {
  struct stat st {};
  Fd fd = open_nonblocking(path, what, st);
  TOPKV_CHECK(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode), "{} '{}' is {}: give the path of "
              "a file", what, path, kind_of(st.st_mode));
  // Blocking reads from here: a pipe with a writer waits for its text; one
  // that no process has open for writing reads as empty at once.
  set_blocking(fd.get());
  return read_all(fd.get(), path, what, max_bytes, S_ISREG(st.st_mode) ? (size_t)st.st_size : 0);
}

void check_output_path(const std::string& path, std::string_view what) {
  TOPKV_CHECK(!path.empty(), "the {} path is empty", what);
  std::error_code ec;
  TOPKV_CHECK(!fs::is_directory(path, ec), "the {} '{}' is a folder: give a file name", what, path);
  const std::string dir = folder_of(path);
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    TOPKV_CHECK(!ec, "cannot create the folder '{}' for the {} '{}': {}", dir, what, path, ec.message());
  }
  TOPKV_CHECK(fs::is_directory(dir, ec), "the {} '{}' cannot be written: '{}' is not a folder", what, path, dir);
  TOPKV_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "the {} '{}' cannot be written: the folder '{}' is not "
              "writable ({})", what, path, dir, std::strerror(errno));
}

AtomicFile::AtomicFile(std::string path, std::string_view what) : path_(std::move(path)), what_(what) {
  check_output_path(path_, what_);
  const std::string name = fs::path(path_).filename().string();
  std::string tmpl = folder_of(path_) + "/." + name + ".XXXXXX";
  const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);  // O_CREAT | O_EXCL: never an existing file or a symlink
  TOPKV_CHECK(fd >= 0, "cannot create a temporary file beside the {} '{}': {}", what_, path_, std::strerror(errno));
  tmp_ = tmpl;
  temp_slot_ = claim_temp_slot(tmp_);
  f_ = ::fdopen(fd, "wb");
  if (!f_) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp_.c_str());
    release_temp_slot(temp_slot_);
    fail("cannot write the {} '{}': {}", what_, path_, std::strerror(err));
  }
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) ::unlink(tmp_.c_str());
  release_temp_slot(temp_slot_);
}

void AtomicFile::write(const void* data, size_t n) {
  if (n && ok_ && std::fwrite(data, 1, n, f_) != n) {
    const int err = errno;
    ok_ = false;
    fail("writing the {} '{}' failed: {} (disk full?)", what_, path_, std::strerror(err));
  }
}

void AtomicFile::commit() {
  TOPKV_CHECK(f_ && !committed_, "internal: AtomicFile '{}' committed twice", path_);
  bool ok = ok_ && !std::ferror(f_) && std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0 &&
            ::fchmod(fileno(f_), create_mode()) == 0;
  int err = errno;
  ok = (std::fclose(f_) == 0) && ok;
  if (!ok && err == 0) err = errno;
  f_ = nullptr;
  TOPKV_CHECK(ok, "writing the {} '{}' failed: {} (disk full?)", what_, path_, std::strerror(err));
  // An output computed from an input that changed under the run is not kept.
  check_mapped_files_unchanged();
  TOPKV_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot write the {} '{}': {}", what_, path_,
              std::strerror(errno));
  committed_ = true;
  // The rename itself is durable once the folder is synced.
  Fd dfd(::open(folder_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) ::fsync(dfd.get());
}

void write_file_atomic(const std::string& path, std::string_view content, std::string_view what) {
  AtomicFile f(path, what);
  f.write(content);
  f.commit();
}

}  // namespace topkv
