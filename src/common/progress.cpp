#include "src/common/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace topkv {

static std::atomic<bool> g_progress_enabled{true};
void Progress::set_global_enabled(bool on) { g_progress_enabled = on; }

Progress::Progress(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      enabled_(enabled && g_progress_enabled), tty_(isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::add(int64_t n) {
  done_ += n;
  if (enabled_) draw(false);
}

void Progress::set(int64_t done) {
  done_ = done;
  if (enabled_) draw(false);
}

void Progress::finish() {
  if (!enabled_ || finished_.exchange(true)) return;
  draw(true);
  if (tty_) std::fputc('\n', stderr);
}

static std::string human(double x) {
  if (x >= 1e9) return fmt::format("{:.2f}G", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{:.0f}", x);
}

void Progress::draw(bool force) {
  // Workers never wait on the bar: a draw already under way is enough.
  std::unique_lock<std::mutex> lk(mu_, std::defer_lock);
  if (force)
    lk.lock();
  else if (!lk.try_lock())
    return;
  auto now = std::chrono::steady_clock::now();
  int64_t done = done_.load();
  double frac = total_ > 0 ? std::min(1.0, (double)done / (double)total_) : 0.0;
  int decile = (int)(frac * 10);
  if (!force) {
    if (tty_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    if (!tty_ && decile == last_decile_) return;
  }
  if (!tty_ && done == last_printed_) return;  // a log line per state, not two
  last_printed_ = done;
  last_draw_ = now;
  last_decile_ = decile;
  double secs = std::chrono::duration<double>(now - start_).count();
  double rate = secs > 0 ? done / secs : 0;
  double eta = rate > 0 && total_ > done ? (total_ - done) / rate : 0;
  const int width = 30;
  int fill = (int)(frac * width);
  std::string bar(fill, '#');
  bar.resize(width, '.');
  std::string line = fmt::format("{} [{}] {:5.1f}% {}/{} {}  {}/s {} {:.1f}s{}", label_, bar, frac * 100,
                                 human(done), human(total_), unit_, human(rate), unit_, secs,
                                 eta > 0 ? fmt::format(" (eta {:.0f}s)", eta) : std::string());
  if (tty_)
    std::fprintf(stderr, "\r%s\x1b[K", line.c_str());
  else
    std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace topkv
