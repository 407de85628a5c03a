// A reader/writer lock that prefers writers: once a writer waits, new readers
// queue behind it. glibc's default rwlock (under std::shared_mutex) prefers
// readers, so a stream of back-to-back searches could starve add_new_rows()
// for seconds (measured: 2.6 s with two searching threads). Meets the
// SharedMutex requirements, so std::shared_lock / std::unique_lock work.
#pragma once
#include <pthread.h>

namespace topkv {

class RwLock {
 public:
  RwLock() {
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &a);
    pthread_rwlockattr_destroy(&a);
  }
  ~RwLock() { pthread_rwlock_destroy(&lock_); }
  RwLock(const RwLock&) = delete;
  RwLock& operator=(const RwLock&) = delete;
  void lock() { pthread_rwlock_wrlock(&lock_); }
  bool try_lock() { return pthread_rwlock_trywrlock(&lock_) == 0; }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  bool try_lock_shared() { return pthread_rwlock_tryrdlock(&lock_) == 0; }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

}  // namespace topkv
