// Soak (CTest label `long`, not in the default CI run): 100K generated tokens
// with the offloaded top-k runtime on the CPU (a tiny synthetic gemma3), the
// process's resident memory sampled every 100 ms. Checks:
//   - it ends normally with every token generated;
//   - memory is bounded: past the first 10% of the run, RSS grows by no more
//     than what the context's KV store and index legitimately take (their
//     bytes per token, from the run's own geometry) plus 64 MiB;
//   - a second run, stopped and continued (SIGSTOP / SIGCONT) every 0.5 s,
//     prints the same text: interruptions change nothing.
// Writes the memory curve to soak_rss.csv (seconds, RSS bytes) in the
// working directory.
//   soak_generate [tokens]      (default 100000)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kBin = std::string(TOPKV_BINARY_DIR) + "/bin/topkv";

size_t rss_bytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Run {
  int status = -1;
  std::vector<std::pair<double, size_t>> rss;  // (seconds, bytes)
};

// Runs `cmd` (argv via /bin/sh -c, stdout to `out`), sampling RSS; with
// `interrupt`, stops and continues it every 0.5 s.
Run run(const std::string& cmd, bool interrupt) {
  Run r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), (char*)nullptr);
    ::_exit(127);
  }
  const auto t0 = std::chrono::steady_clock::now();
  int tick = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &r.status, WNOHANG);
    if (done == pid) break;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (const size_t b = rss_bytes(pid)) r.rss.push_back({s, b});
    if (interrupt && ++tick % 5 == 0) {
      ::kill(pid, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ::kill(pid, SIGCONT);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const long tokens = argc > 1 ? std::atol(argv[1]) : 100000;
  const std::string dir = "soak_tmp";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string model = dir + "/soak.gguf";
  if (std::system((kBin + " model synth --preset tiny-gemma3 --context 262144 -q -o " + model).c_str()) != 0) {
    std::fprintf(stderr, "soak: model synth failed\n");
    return 1;
  }
  // tiny-gemma3: 2 full-context (retrieval) layers of 1 KV head, head_dim 64.
  // Per token and layer: K and V in the f16 store, the index (~40 B, 100
  // allowed), and K and V in fp32 should the model's own cache be touched too.
  const double per_token = 2 * (64 * 2 * 2.0 + 100.0 + 64 * 2 * 4.0);
  const std::string gen = kBin + " generate -m " + model + " -p 'The keeper wrote in his log every night' -n " +
                          std::to_string(tokens) + " -c " + std::to_string(tokens + 64) +
                          " --attn topk --index multipole --k 64 --window 256 --sinks 4 --threads 2";
  Run a = run(gen + " > " + dir + "/a.txt 2> " + dir + "/a.err", false);
  {
    std::ofstream csv("soak_rss.csv");
    csv << "seconds,rss_bytes\n";
    for (auto& [s, b] : a.rss) csv << s << "," << b << "\n";
  }
  if (!WIFEXITED(a.status) || WEXITSTATUS(a.status) != 0 || a.rss.size() < 10) {
    std::fprintf(stderr, "soak: the run failed (status %d, %zu samples):\n%s\n", a.status, a.rss.size(),
                 slurp(dir + "/a.err").c_str());
    return 1;
  }
  const size_t early = a.rss[a.rss.size() / 10].second;
  size_t peak = 0;
  for (auto& [s, b] : a.rss) peak = std::max(peak, b);
  const double allowed = early + per_token * tokens + 64.0 * 1024 * 1024;
  std::printf("soak: %ld tokens in %.1f s, RSS %.1f MiB at 10%%, peak %.1f MiB (bound %.1f MiB)\n", tokens,
              a.rss.back().first, early / 1048576.0, peak / 1048576.0, allowed / 1048576.0);
  if (peak > allowed) {
    std::fprintf(stderr, "soak: resident memory grew past the bound\n");
    return 1;
  }
  Run b = run(gen + " > " + dir + "/b.txt 2> " + dir + "/b.err", true);
  if (!WIFEXITED(b.status) || WEXITSTATUS(b.status) != 0) {
    std::fprintf(stderr, "soak: the interrupted run failed:\n%s\n", slurp(dir + "/b.err").c_str());
    return 1;
  }
  const std::string ta = slurp(dir + "/a.txt"), tb = slurp(dir + "/b.txt");
  if (ta.empty() || ta != tb) {
    std::fprintf(stderr, "soak: the interrupted run printed different text (%zu vs %zu bytes)\n", ta.size(),
                 tb.size());
    return 1;
  }
  std::printf("soak: the interrupted run printed the same %zu bytes\n", ta.size());
  std::system(("rm -rf " + dir).c_str());
  return 0;
}
