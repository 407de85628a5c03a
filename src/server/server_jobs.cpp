#include "src/server/server_jobs.h"

namespace topkv::server {

bool JobQueue::try_push(std::shared_ptr<Job> job) {
  {
    std::lock_guard lk(mu_);
    if (closed_ || q_.size() >= capacity_) return false;
    q_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

std::shared_ptr<Job> JobQueue::pop() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return closed_ || !q_.empty(); });
  if (closed_) return nullptr;
  std::shared_ptr<Job> j = std::move(q_.front());
  q_.pop_front();
  return j;
}

void JobQueue::close() {
  {
    std::lock_guard lk(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

size_t JobQueue::waiting() const {
  std::lock_guard lk(mu_);
  return q_.size();
}

}  // namespace topkv::server
