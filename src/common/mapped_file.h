// Memory-mapped inputs (GGUF models, context packs) that are changed while in use.
//
// A file truncated under a mapping raises SIGBUS on the first read past its
// new end, anywhere: in a matmul on an OpenMP thread, in a decode step's row
// gather. A siglongjmp guard around each such read would cost the hot loops and
// cannot unwind an OpenMP region, so the guard is process-wide: every mapping is
// registered here, and a SIGBUS handler that finds the faulting address in one
// prints an error naming the file and the offset, removes the temporaries of
// outputs in flight (src/common/file_io.h) and exits with status 1. A fault at
// any other address keeps the default action (a crash, as before).
//
// A file rewritten in place without changing its length does not fault: pages
// not yet read show the new bytes. check_mapped_files_unchanged() compares each
// mapped file's inode, size and modification time with those it had when it was
// mapped; AtomicFile::commit calls it before an output lands, and the CLI after
// each command, so a run whose input changed under it fails instead of exiting 0.
// (A file replaced by rename, the safe way to update one, is not a change: the
// mapping keeps the old inode.)
#pragma once
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace topkv {

// One registered mapping of `path` (as fstat'ed when opened): `bytes` at `base`
// show the file from `file_offset` on. Unregistered on destruction (before the
// munmap). Movable.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(const std::string& path, const struct stat& st, const void* base, size_t bytes,
               uint64_t file_offset = 0);
  ~MappedRegion() { reset(); }
  MappedRegion(MappedRegion&& o) noexcept : slot_(o.slot_) { o.slot_ = -1; }
  MappedRegion& operator=(MappedRegion&& o) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  void reset();

 private:
  int slot_ = -1;
};

// Error naming the first mapped file whose inode is the same but whose size or
// modification time is not: now, or when its last mapping was released
// (the CLI calls it after each command, when the files are closed).
void check_mapped_files_unchanged();

}  // namespace topkv
