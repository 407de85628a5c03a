// Files in and out, the one way every topkv reader and writer takes.
//
// In: a file is opened without blocking (O_NONBLOCK: a FIFO given as a model,
// pack or prompt never hangs the open) and checked before a byte is read: a
// file that is mapped or read whole must be a regular file, a text input may
// also be a pipe or a character device; anything else is an Error naming it.
//
// Out: AtomicFile writes a uniquely named temporary beside the target
// (mkstemp: O_CREAT | O_EXCL, so a symlink or a file already there is never
// followed, truncated or removed), syncs it and renames it over the target.
// A failure or an exception removes the temporary and nothing else; the
// target is either the old file or the complete new one. Before the rename it
// checks that no memory-mapped input changed meanwhile (src/common/mapped_file.h),
// so an output computed from a file rewritten under the run never lands.
//
// check_output_path() is called before the work: the folder of an output is
// created when missing and must be writable, and the path must not be a folder.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <sys/stat.h>

namespace topkv {

// An open file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Opens `path` read-only without blocking and checks it is a regular file
// (`what` names it in errors: "model", "context pack", "prompt file"). The
// descriptor is returned in blocking mode; `st` receives its fstat.
Fd open_regular_file(const std::string& path, std::string_view what, struct stat* st = nullptr);

// The whole of a regular file (checked as above); files over `max_bytes` are
// an Error.
std::string read_regular_file(const std::string& path, std::string_view what, uint64_t max_bytes = 1ull << 32);

// A text input read as a stream (prompt, questions, config, head pattern): a
// regular file, or a pipe or character device (`-f <(cmd)`, /dev/stdin), opened
// without blocking so a FIFO that no process writes to reads as empty instead
// of hanging; a folder, socket or block device is an Error naming the file.
std::string read_text_input(const std::string& path, std::string_view what, uint64_t max_bytes = 1ull << 32);

// Before the work: creates the folder of `path` when missing, and checks that
// it is writable and that `path` is not itself a folder. `what` names the
// output in errors ("--json report", "context pack").
void check_output_path(const std::string& path, std::string_view what);

class AtomicFile {
 public:
  // Creates the temporary "<folder>/.<name>.XXXXXX" (check_output_path first).
  AtomicFile(std::string path, std::string_view what);
  ~AtomicFile();  // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  std::FILE* stream() { return f_; }  // buffered; write() uses it too
  const std::string& temp_path() const { return tmp_; }
  const std::string& path() const { return path_; }
  // Flushes, syncs, gives the file the mode a plain create would (0666 less
  // the umask), renames it over the target and syncs the folder.
  void commit();

 private:
  std::string path_, tmp_, what_;
  std::FILE* f_ = nullptr;
  bool ok_ = true, committed_ = false;
  int temp_slot_ = -1;  // its entry in the temporaries removed on a fatal signal
};

// The whole of `content` written to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view content, std::string_view what);

// Temporaries of AtomicFiles in flight, removed by a fatal-signal handler
// (mapped_file.cpp's SIGBUS guard) with async-signal-safe unlink(2).
void unlink_temporaries_for_signal();

}  // namespace topkv
