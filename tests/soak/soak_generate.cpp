// Soak (CTest label `long`, not in the default CI run): 100K generated tokens
// through the offloaded top-k runtime, memory sampled while it runs. Checks:
//   - it ends normally with every token generated;
//   - memory is bounded: past the first 10% of the run, host RSS (and, with
//     --gpu, the process's GPU memory) grows by no more than what the
//     context's store, index and caches legitimately take per token
//     (--bytes-per-token; the default is the tiny model's geometry) plus 64 MiB;
//   - a second run, stopped and continued (SIGSTOP / SIGCONT) every 0.5 s,
//     prints the same text: interruptions change nothing.
// Writes the memory curve to soak_memory.csv in the working directory
// (seconds, run, host RSS bytes, GPU bytes).
//   soak_generate [--tokens N]                     CPU, tiny synthetic gemma3 (the CTest)
//   soak_generate --tokens 100000 --model gemma.gguf --pack d.tkv --gpu --together
//       --bytes-per-token 9612 -- --k 1024         GPU host, a real model from a pack
// With --together both runs go side by side (one GPU serves two processes);
// without it the interrupted run follows the plain one.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

using namespace topkv;

namespace {

std::string kBin = std::string(TOPKV_BINARY_DIR) + "/bin/topkv";  // --topkv changes it

size_t rss_bytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// GPU memory per process from nvidia-smi (MiB -> bytes); empty when it is
// missing or the process holds no context yet.
std::map<pid_t, size_t> gpu_bytes_by_pid() {
  std::map<pid_t, size_t> out;
  FILE* p = ::popen("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null", "r");
  if (!p) return out;
  char line[256];
  while (std::fgets(line, sizeof line, p)) {
    long pid = 0, mib = 0;
    if (std::sscanf(line, "%ld, %ld", &pid, &mib) == 2) out[(pid_t)pid] = (size_t)mib << 20;
  }
  ::pclose(p);
  return out;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Sample {
  double seconds;
  size_t rss, gpu;
};

struct Run {
  std::string name;
  bool interrupt = false;
  pid_t pid = -1;
  int status = -1;
  bool done = false;
  std::vector<Sample> samples;
};

pid_t spawn(const std::string& cmd) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), (char*)nullptr);
    ::_exit(127);
  }
  return pid;
}

// Runs the commands side by side, sampling host RSS every 100 ms (GPU memory
// every second with `gpu`); runs marked `interrupt` are stopped and continued
// every 0.5 s.
void watch(std::vector<Run*> runs, const std::vector<std::string>& cmds, bool gpu) {
  for (size_t i = 0; i < runs.size(); ++i) runs[i]->pid = spawn(cmds[i]);
  const auto t0 = std::chrono::steady_clock::now();
  std::map<pid_t, size_t> gpu_now;
  for (int tick = 0;; ++tick) {
    bool all_done = true;
    if (gpu && tick % 10 == 0) gpu_now = gpu_bytes_by_pid();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (Run* r : runs) {
      if (r->done) continue;
      if (::waitpid(r->pid, &r->status, WNOHANG) == r->pid) {
        r->done = true;
        continue;
      }
      all_done = false;
      const auto g = gpu_now.find(r->pid);
      if (const size_t b = rss_bytes(r->pid)) r->samples.push_back({s, b, g == gpu_now.end() ? 0 : g->second});
      if (r->interrupt && tick % 5 == 4) {
        ::kill(r->pid, SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ::kill(r->pid, SIGCONT);
      }
    }
    if (all_done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

bool ok(const Run& r) { return WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0; }

// Past the first 10% of the run, memory may grow by `per_token * tokens`
// plus 64 MiB; prints the figures and says whether the bound held.
bool bounded(const Run& r, bool gpu, double per_token, long tokens) {
  const size_t early_at = r.samples.size() / 10;
  bool held = true;
  for (int which = 0; which < (gpu ? 2 : 1); ++which) {
    auto value = [&](const Sample& s) { return which == 0 ? s.rss : s.gpu; };
    size_t early = 0;
    for (size_t i = early_at; i < r.samples.size() && !early; ++i) early = value(r.samples[i]);
    size_t peak = 0;
    for (const Sample& s : r.samples) peak = std::max(peak, value(s));
    const double allowed = early + per_token * tokens + 64.0 * 1024 * 1024;
    std::printf("soak: %s run, %s: %.1f MiB at 10%% of the run, peak %.1f MiB (bound %.1f MiB)\n", r.name.c_str(),
                which == 0 ? "host RSS" : "GPU memory", early / 1048576.0, peak / 1048576.0, allowed / 1048576.0);
    if (peak > allowed) {
      std::fprintf(stderr, "soak: %s of the %s run grew past the bound\n", which == 0 ? "host RSS" : "GPU memory",
                   r.name.c_str());
      held = false;
    }
  }
  return held;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Soak: a long generation through the offloaded runtime with its memory sampled"};
  long tokens = 100000;
  std::string model, pack, prompt = "The keeper wrote in his log every night", out = "soak_tmp";
  bool gpu = false, together = false, keep = false;
  // tiny-gemma3: 2 full-context (retrieval) layers of 1 KV head, head_dim 64.
  // Per token and layer: K and V in the f16 store, the index (~40 B, 100
  // allowed), and K and V in fp32 should the model's own cache be touched too.
  double per_token = 2 * (64 * 2 * 2.0 + 100.0 + 64 * 2 * 4.0);
  std::vector<std::string> extra;
  app.add_option("--tokens", tokens, "tokens to generate")->check(CLI::Range(100L, 100000000L));
  app.add_option("--topkv", kBin, "the topkv binary to run")->capture_default_str()->check(CLI::ExistingFile);
  app.add_option("--model", model, "GGUF to generate with (default: a tiny synthetic gemma3 made here)")
      ->check(CLI::ExistingFile);
  app.add_option("--pack", pack, "context pack to start from (topkv index build)")->check(CLI::ExistingFile);
  app.add_option("--prompt", prompt, "prompt text");
  app.add_option("--out", out, "working folder (made; removed at the end unless --keep)");
  app.add_option("--bytes-per-token", per_token,
                 "memory each generated token may add (store, index, caches), host and GPU alike")
      ->check(CLI::PositiveNumber);
  app.add_flag("--gpu", gpu, "CUDA backend; also sample the processes' GPU memory (nvidia-smi)");
  app.add_flag("--together", together, "run the plain and the interrupted run side by side");
  app.add_flag("--keep", keep, "keep the working folder (the outputs, the model made here)");
  app.add_option("extra", extra, "more `topkv generate` options, after --");
  app.positionals_at_end(false);
  CLI11_PARSE(app, argc, argv);

  std::system(("rm -rf " + quote(out) + " && mkdir -p " + quote(out)).c_str());
  if (model.empty()) {
    model = out + "/soak.gguf";
    if (std::system((kBin + " model synth --preset tiny-gemma3 --context 262144 -q -o " + quote(model)).c_str()) != 0) {
      std::fprintf(stderr, "soak: model synth failed\n");
      return 1;
    }
    if (extra.empty()) extra = {"--index", "multipole", "--k", "64", "--window", "256", "--sinks", "4", "--threads", "2"};
  }
  std::string gen = kBin + " generate -m " + quote(model) + " -p " + quote(prompt) + " -n " + std::to_string(tokens) +
                    " --temp 0 --ignore-eos -q";
  // A pack fixes the attention mode (top-k when it was built with an index).
  if (!pack.empty()) gen += " --pack " + quote(pack);
  else gen += " --attn topk -c " + std::to_string(tokens + 64);
  if (gpu) gen += " --backend cuda";
  for (const std::string& e : extra) gen += " " + quote(e);
  std::printf("soak: %s\n", gen.c_str());

  Run a, b;
  a.name = "plain", b.name = "interrupted", b.interrupt = true;
  const std::string cmd_a = gen + " > " + quote(out + "/a.txt") + " 2> " + quote(out + "/a.err");
  const std::string cmd_b = gen + " > " + quote(out + "/b.txt") + " 2> " + quote(out + "/b.err");
  if (together) {
    watch({&a, &b}, {cmd_a, cmd_b}, gpu);
  } else {
    watch({&a}, {cmd_a}, gpu);
    if (ok(a)) watch({&b}, {cmd_b}, gpu);
  }
  {
    std::ofstream csv("soak_memory.csv");
    csv << "seconds,run,rss_bytes,gpu_bytes\n";
    for (const Run* r : {&a, &b})
      for (const Sample& s : r->samples) csv << s.seconds << "," << r->name << "," << s.rss << "," << s.gpu << "\n";
  }
  for (const Run* r : {&a, &b}) {
    if (r->pid < 0) continue;
    if (!ok(*r)) {
      std::fprintf(stderr, "soak: the %s run failed (status %d):\n%s\n", r->name.c_str(), r->status,
                   test::slurp(out + (r == &a ? "/a.err" : "/b.err")).c_str());
      return 1;
    }
    if (r->samples.size() < 10) {
      std::fprintf(stderr, "soak: the %s run ended after %zu memory samples (100 ms apart), too few to judge: "
                   "give more --tokens\n", r->name.c_str(), r->samples.size());
      return 1;
    }
  }
  std::printf("soak: %ld tokens; plain run %.1f s, interrupted run %.1f s\n", tokens, a.samples.back().seconds,
              b.samples.back().seconds);
  bool held = bounded(a, gpu, per_token, tokens);
  held = bounded(b, gpu, per_token, tokens) && held;
  if (!held) return 1;
  const std::string ta = test::slurp(out + "/a.txt"), tb = test::slurp(out + "/b.txt");
  if (ta.empty() || ta != tb) {
    std::fprintf(stderr, "soak: the interrupted run printed different text (%zu vs %zu bytes)\n", ta.size(),
                 tb.size());
    return 1;
  }
  std::printf("soak: the interrupted run printed the same %zu bytes\n", ta.size());
  if (!keep) std::system(("rm -rf " + quote(out)).c_str());
  return 0;
}
