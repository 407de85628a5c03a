#include "src/common/mapped_file.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "src/common/error.h"
#include "src/common/file_io.h"

namespace topkv {

namespace {

// Fixed tables, read by the signal handler without locks or allocation. A pack
// maps each index array on its own (copy-on-write views), so regions are many;
// files are few.
constexpr int kFiles = 64, kRegions = 8192;
constexpr size_t kPathMax = 1024;

struct FileEntry {
  char path[kPathMax];
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime;
  int refs;  // under g_mu
};
struct RegionEntry {
  std::atomic<uintptr_t> base{0};  // 0 = free
  size_t bytes = 0;
  uint64_t file_offset = 0;
  int file = -1;
};

FileEntry g_files[kFiles];
std::atomic<bool> g_file_live[kFiles];
RegionEntry g_regions[kRegions];
std::mutex g_mu;
bool g_handler_installed = false;
std::string g_changed;  // the first file found modified in place when its last mapping went

bool modified_in_place(const FileEntry& e) {
  struct stat st {};
  if (::stat(e.path, &st) != 0 || st.st_dev != e.dev || st.st_ino != e.ino) return false;  // replaced: ours intact
  return st.st_size != e.size || st.st_mtim.tv_sec != e.mtime.tv_sec || st.st_mtim.tv_nsec != e.mtime.tv_nsec;
}

void release_file_locked(int f) {
  if (f < 0 || --g_files[f].refs > 0) return;
  if (g_changed.empty() && modified_in_place(g_files[f])) g_changed = g_files[f].path;
  g_file_live[f].store(false);
}

void put(const char* s) {
  for (size_t n = std::strlen(s); n > 0;) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= (size_t)w;
  }
}

void put_u64(uint64_t v) {
  char buf[24];
  int i = 23;
  buf[i] = 0;
  do buf[--i] = (char)('0' + v % 10), v /= 10;
  while (v && i > 0);
  put(buf + i);
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const auto addr = (uintptr_t)info->si_addr;
  for (int r = 0; r < kRegions; ++r) {
    const uintptr_t base = g_regions[r].base.load(std::memory_order_acquire);
    if (!base || addr < base || addr - base >= g_regions[r].bytes) continue;
    const int f = g_regions[r].file;
    put("topkv: error: the file '");
    put(f >= 0 ? g_files[f].path : "?");
    put("' was truncated or changed while this run had it mapped in memory (a read at byte ");
    put_u64(g_regions[r].file_offset + (addr - base));
    put(" failed with SIGBUS). Do not modify a model or a context pack while topkv uses it: replace it by "
        "writing a new file and renaming it over the old one, and run again.\n");
    unlink_temporaries_for_signal();
    ::_exit(1);
  }
  // Not one of ours: the default action (the fault repeats when we return).
  ::signal(sig, SIG_DFL);
}

void install_handler_locked() {
  if (g_handler_installed) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
  g_handler_installed = true;
}

int file_slot_locked(const std::string& path, const struct stat& st) {
  int free_slot = -1;
  for (int f = 0; f < kFiles; ++f) {
    if (g_file_live[f].load()) {
      FileEntry& e = g_files[f];
      if (e.dev == st.st_dev && e.ino == st.st_ino && path == e.path) return ++e.refs, f;
    } else if (free_slot < 0) {
      free_slot = f;
    }
  }
  if (free_slot < 0) return -1;
  FileEntry& e = g_files[free_slot];
  std::strncpy(e.path, path.c_str(), kPathMax - 1);
  e.path[kPathMax - 1] = 0;
  e.dev = st.st_dev, e.ino = st.st_ino, e.size = st.st_size, e.mtime = st.st_mtim, e.refs = 1;
  g_file_live[free_slot].store(true);
  return free_slot;
}

}  // namespace

MappedRegion::MappedRegion(const std::string& path, const struct stat& st, const void* base, size_t bytes,
                           uint64_t file_offset) {
  if (!base || bytes == 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  install_handler_locked();
  const int f = file_slot_locked(path, st);
  for (int r = 0; r < kRegions; ++r) {
    if (g_regions[r].base.load(std::memory_order_relaxed)) continue;
    g_regions[r].bytes = bytes, g_regions[r].file_offset = file_offset, g_regions[r].file = f;
    g_regions[r].base.store((uintptr_t)base, std::memory_order_release);
    slot_ = r;
    return;
  }
  // More than kRegions mappings: this one keeps the default SIGBUS action.
  release_file_locked(f);
}

MappedRegion& MappedRegion::operator=(MappedRegion&& o) noexcept {
  if (this != &o) {
    reset();
    slot_ = o.slot_;
    o.slot_ = -1;
  }
  return *this;
}

void MappedRegion::reset() {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  RegionEntry& r = g_regions[slot_];
  r.base.store(0, std::memory_order_release);
  release_file_locked(r.file);
  slot_ = -1;
}

void check_mapped_files_unchanged() {
  std::string changed;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    changed = g_changed;
    for (int f = 0; f < kFiles && changed.empty(); ++f)
      if (g_file_live[f].load() && modified_in_place(g_files[f])) changed = g_files[f].path;
  }
  TOPKV_CHECK(changed.empty(), "the file '{}' was modified in place while this run had it mapped in memory, so what "
              "the run read may mix old and new bytes and its result is not kept. Do not modify a model or a context "
              "pack while topkv uses it (write a new file and rename it over the old one), and run again", changed);
}

}  // namespace topkv
