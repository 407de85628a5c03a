// Hostile but fair inputs (issue 17): each family is tried through the CLI
// and must end in a clear topkv error, a non-zero exit, no crash, no hang and
// no file of the user's lost. Tiny synthetic gemma3 models; seconds each.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "offload/policy.h"
#include "src/common/checksum.h"
#include "src/common/error.h"
#include "src/common/file_io.h"
#include "src/common/mapped_file.h"
#include "src/common/parallel_errors.h"
#include "src/common/safetensors.h"
#include "src/model/gguf.h"
#include "test_util.h"

using namespace topkv;
using test::run_topkv;
namespace fs = std::filesystem;

namespace {

const std::string kDoc =
    "The lighthouse keeper wrote in his log every night. On the first night the sea was calm and the lamp burned "
    "bright. On the second night a storm came from the west. The secret word is amber.";

struct Files {
  test::TempDir dir{"topkv_hostile"};
  std::string model = dir.file("tiny.gguf"), doc = dir.file("doc.txt");
  Files() {
    REQUIRE(run_topkv("model synth --preset tiny-gemma3 -q -o " + model).rc == 0);
    std::ofstream(doc) << kDoc;
  }
  std::string gen(const std::string& args) const { return "generate -m " + model + " -p hello -n 2 " + args; }
  std::string pack(const std::string& name, const std::string& args = "") const {
    const std::string out = dir.file(name);
    auto r = run_topkv("index build -m " + model + " -f " + doc + " -o " + out +
                       " --index multipole --k 8 --window 4 --sinks 2 -q " + args);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    return out;
  }
};

// A clear topkv error: exit 1 (or CLI11's parse error), the message, no crash.
void expect_error(const test::CliRun& r, const std::string& message) {
  INFO("stderr: " << r.err);
  CHECK(r.rc != 0);
  CHECK(r.rc != -1);  // not killed by a signal
  CHECK(r.err.find(message) != std::string::npos);
  CHECK(r.err.find("terminate called") == std::string::npos);
  CHECK(r.err.find("internal error") == std::string::npos);
}

// Every file of `dir` except the ones named: no temporaries left behind.
std::vector<std::string> stray_files(const std::string& dir, const std::vector<std::string>& expected) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (std::find(expected.begin(), expected.end(), name) == expected.end()) out.push_back(name);
  }
  return out;
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The GGUF `src` with the 4 bytes after metadata key `key`'s type replaced.
void patch_gguf_u32(const std::string& src, const std::string& dst, const std::string& key, uint32_t type,
                    const void* value) {
  std::string d = test::slurp(src);
  const size_t at = d.find(key);
  REQUIRE(at != std::string::npos);
  uint32_t t;
  std::memcpy(&t, d.data() + at + key.size(), 4);
  REQUIRE(t == type);
  std::memcpy(d.data() + at + key.size() + 4, value, 4);
  write_file(dst, d);
}

}  // namespace

TEST_CASE("hostile: policy values are refused wherever they come from") {
  Files f;
  expect_error(run_topkv(f.gen("--attn topk --index multipole --window 2 --threshold 2")),
               "--threshold must be a number in [0, 1]");
  for (const char* bad : {"-1", "nan", "inf"})
    expect_error(run_topkv(f.gen(std::string("--attn topk --threshold ") + bad)), "--threshold");
  expect_error(run_topkv(f.gen("--attn topk --ef -1")), "--ef must be in");
  expect_error(run_topkv(f.gen("--attn topk --nprobe -1")), "--nprobe must be in");
  expect_error(run_topkv(f.gen("--attn topk --heads-sparsity 1.5")), "--heads-sparsity");
  expect_error(run_topkv(f.gen("--attn topk --window 2147483647")), "--window must be at least 1 token and at most");
  expect_error(run_topkv(f.gen("--attn topk --sinks 2147483647")), "--sinks must be in");
  expect_error(run_topkv(f.gen("-c -1")), "--ctx");
  expect_error(run_topkv(f.gen("-c 0")), "--ctx");
  expect_error(run_topkv(f.gen("--threads -1")), "--threads must be in [0, 4096]");
  expect_error(run_topkv(f.gen("--threads 1000000")), "--threads must be in [0, 4096]");
  expect_error(run_topkv(f.gen("--attn topk --store-cache banana")), "--store-cache 'banana' is not auto, off or a size");
  expect_error(run_topkv(f.gen("--attn topk --store-cache -5G")), "--store-cache '-5G'");
  expect_error(run_topkv(f.gen("--attn topk --store-type f32")), "--store-type");
  expect_error(run_topkv(f.gen("--attn topk --store-type e5m2")), "--store-type");

  // --config: integers exact, enums named, every value validated.
  const std::pair<const char*, const char*> configs[] = {
      {R"({"window": 4294967297})", "key 'window' = 4294967297 is out of range"},
      {R"({"sinks": 2.9})", "key 'sinks' has the wrong type: it must be an integer"},
      {R"({"gqa": "banana"})", "unknown gqa mode 'banana'"},
      {R"({"threshold": 2})", "--threshold must be a number in [0, 1]"},
      {R"({"threshold": -1e400})", "policy.json"},
      {R"({"k": -5})", "--k must be at least 1"},
      {R"({"stage_rows": 1})", "must be true or false"},
      {R"({"k": 1e999})", "policy.json"},
      {R"({"store_cache": -2})", "store_cache must be -1 (auto), 0 (off) or a size in bytes"},
      {R"({"store_cache": "lots"})", "--store-cache 'lots' is not auto, off or a size"},
      {R"({"store_type": "f32"})", "unknown KV store type 'f32'"},
  };
  for (auto& [json, message] : configs) {
    write_file(f.dir.file("policy.json"), json);
    INFO(json);
    expect_error(run_topkv(f.gen("--attn topk --config " + f.dir.file("policy.json"))), message);
  }

  // index build refuses the value before any work: no pack is written.
  auto r = run_topkv("index build -m " + f.model + " -f " + f.doc + " -o " + f.dir.file("p.tkv") +
                     " --threshold 2 -q");
  expect_error(r, "--threshold must be a number in [0, 1]");
  CHECK_FALSE(fs::exists(f.dir.file("p.tkv")));
}

TEST_CASE("hostile: a pack manifest's policy goes through the same validation") {
  // PackReader hands the manifest's "policy" object to OffloadPolicy::apply_json.
  OffloadPolicy p;
  CHECK_THROWS_WITH(p.apply_json(R"({"threshold": 2, "window": 4})", "p.tkv (policy)"),
                    Catch::Contains("p.tkv (policy): --threshold must be a number in [0, 1]"));
  CHECK_THROWS_WITH(p.apply_json(R"({"window": 4294967297})", "p.tkv (policy)"),
                    Catch::Contains("out of range"));
  OffloadPolicy q;
  q.search.threshold = std::nan("");
  CHECK_THROWS_WITH(q.validate(), Catch::Contains("--threshold"));
  q.search.threshold = 0.5;
  q.heads_threshold = INFINITY;
  CHECK_THROWS_WITH(q.validate(), Catch::Contains("--heads-threshold"));
  OffloadPolicy ok;
  ok.apply_json(ok.to_json(), "round trip");  // the defaults pass
}

TEST_CASE("hostile: an exception in a parallel region reaches the caller") {
  ParallelErrors errors;
  int done = 0;
#pragma omp parallel for reduction(+ : done)
  for (int i = 0; i < 64; ++i) errors.run([&] {
    if (i == 17) fail("item {} is bad", i);
    ++done;
  });
  CHECK(done < 64);
  CHECK_THROWS_WITH(errors.rethrow(), "item 17 is bad");
  CHECK_NOTHROW(errors.rethrow());  // thrown once
}

TEST_CASE("hostile: FIFOs, folders and devices given as inputs never block and are refused where they cannot serve") {
  Files f;
  const std::string fifo = f.dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Each blocked forever in open() before the fix. Mapped or whole-read files
  // must be regular files; a text input may be a pipe (`-f <(cmd)`): one that
  // no process writes to reads as empty at once.
  const auto run = [&](const std::string& args) { return run_topkv(args); };
  expect_error(run("generate -m " + fifo + " -p hi -n 1"), "is a FIFO (named pipe), not a regular file");
  expect_error(run("generate -m " + f.model + " -f " + fifo + " -n 1"), "the prompt is empty");
  expect_error(run("generate -m " + f.model + " -f " + f.doc + " -n 1 --prompts " + fifo), "--prompts needs --pack");
  expect_error(run("generate -m " + f.model + " -f " + f.dir.dir.string() + " -n 1"), "is a folder");
  expect_error(run(f.gen("--attn topk --config " + fifo)), "not valid JSON");
  expect_error(run(f.gen("--attn topk --heads " + fifo)), "0 rows, but the model has 6 layers");
  expect_error(run(f.gen("--attn topk --config " + f.dir.dir.string())), "is actually a directory");
  expect_error(run("generate --pack " + fifo + " -m " + f.model + " -n 1"), "context pack");
  expect_error(run("index info " + fifo), "is a FIFO");
  expect_error(run("generate -m /dev/null -p hi -n 1"), "not a regular file");
  // A pipe with a writer (started first, so it waits in open) is read as the text it carries.
  const std::string bin = std::string(TOPKV_BINARY_DIR) + "/bin/topkv", out = f.dir.file("ids.txt");
  const int status = std::system(("(echo hello > " + fifo + ") & sleep 0.3; " + bin + " tokenize --ids -m " +
                                  f.model + " -f " + fifo + " > " + out + " 2>&1; rc=$?; wait; exit $rc").c_str());
  INFO(test::slurp(out));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(test::slurp(out).find('[') != std::string::npos);
  expect_error(run("bench recall --dump " + fifo + " --quiet"), "is a FIFO");
}

TEST_CASE("hostile: a mapped model truncated under the run is a clear error naming the file") {
  Files f;
  const std::string copy = f.dir.file("victim.gguf");
  fs::copy_file(f.model, copy);
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(pipefd[1], STDERR_FILENO);
    auto g = GgufFile::open(copy);
    const GgufTensor& last = *std::max_element(g->tensors().begin(), g->tensors().end(),
                                               [](auto& a, auto& b) { return a.offset < b.offset; });
    if (::truncate(copy.c_str(), 4096) != 0) ::_exit(3);
    volatile uint8_t x = last.data[last.nbytes - 1];  // SIGBUS: past the new end
    (void)x;
    ::_exit(0);  // not reached
  }
  ::close(pipefd[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) > 0;) err.append(buf, (size_t)n);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO(err);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(err.find("victim.gguf' was truncated or changed while this run had it mapped") != std::string::npos);
}

TEST_CASE("hostile: a mapped file rewritten in place is found before an output lands") {
  Files f;
  const std::string copy = f.dir.file("victim.gguf"), out = f.dir.file("out.txt");
  fs::copy_file(f.model, copy);
  const pid_t pid = ::fork();  // the change is remembered for the process: keep it in a child
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 0;
    {
      auto g = GgufFile::open(copy);
      ::usleep(20000);  // a later modification time, also on coarse clocks
      const int fd = ::open(copy.c_str(), O_WRONLY);
      const char zero[8] = {};
      if (fd < 0 || ::pwrite(fd, zero, 8, (off_t)g->data_offset()) != 8) ::_exit(3);
      ::close(fd);
      try {
        write_file_atomic(out, "derived from the model", "report");
        rc = 4;  // must not land
      } catch (const Error& e) {
        rc = std::string(e.what()).find("modified in place") != std::string::npos ? 0 : 5;
      }
    }
    if (rc == 0 && fs::exists(out)) rc = 6;
    try {
      check_mapped_files_unchanged();  // still reported after the mapping went (the CLI's final check)
      rc = rc ? rc : 7;
    } catch (const Error&) {
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("hostile: atomic writes never follow a symlink, never touch another file, leave nothing behind") {
  Files f;
  const std::string victim = f.dir.file("victim.txt"), mine = f.dir.file("p.tkv.tmp");
  write_file(victim, "precious");
  write_file(mine, "my own file");
  fs::create_symlink(victim, f.dir.file("q.tkv.tmp"));
  // The old fixed temporary names are now a user's files like any other.
  const std::string p = f.pack("p.tkv"), q = f.pack("q.tkv");
  CHECK(test::slurp(victim) == "precious");
  CHECK(test::slurp(mine) == "my own file");
  CHECK(fs::is_symlink(f.dir.file("q.tkv.tmp")));
  // A failing build leaves the user's file and no temporary.
  auto r = run_topkv("index build -m " + f.model + " -f " + f.doc + " -o " + f.dir.file("p.tkv") +
                     " --index nosuchindex -q");
  CHECK(r.rc != 0);
  CHECK(test::slurp(mine) == "my own file");
  CHECK(stray_files(f.dir.dir.string(), {"tiny.gguf", "doc.txt", "victim.txt", "p.tkv.tmp", "q.tkv.tmp",
                                             "p.tkv", "q.tkv"}).empty());

  // The writer itself: a symlink as the target is replaced, its target kept.
  const std::string link = f.dir.file("link.json");
  fs::create_symlink(victim, link);
  write_file_atomic(link, "{}\n", "report");
  CHECK_FALSE(fs::is_symlink(link));
  CHECK(test::slurp(link) == "{}\n");
  CHECK(test::slurp(victim) == "precious");
  {
    AtomicFile a(f.dir.file("never.txt"), "report");
    a.write("half");
    CHECK(fs::exists(a.temp_path()));
  }  // destroyed without commit: gone, target never created
  CHECK_FALSE(fs::exists(f.dir.file("never.txt")));
  CHECK(stray_files(f.dir.dir.string(), {"tiny.gguf", "doc.txt", "victim.txt", "p.tkv.tmp", "q.tkv.tmp",
                                             "p.tkv", "q.tkv", "link.json"}).empty());
  // The mode a plain create gives (0666 less the umask), not mkstemp's 0600.
  struct stat st {};
  REQUIRE(::stat(link.c_str(), &st) == 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  CHECK((st.st_mode & 0777) == (0666 & ~mask));
}

TEST_CASE("hostile: non-finite and absurd values in models, packs and dumps") {
  Files f;
  // GGUF hyperparameters.
  for (float base : {std::nanf(""), 0.f, -1.f, 1.f, INFINITY}) {
    const std::string bad = f.dir.file("rope.gguf");
    patch_gguf_u32(f.model, bad, "gemma3.rope.freq_base", 6 /*F32*/, &base);
    INFO(base);
    expect_error(run_topkv("generate -m " + bad + " -p hi -n 1"), "RoPE base (rope.freq_base)");
  }
  const uint32_t blocks = (1u << 31) - 1;
  patch_gguf_u32(f.model, f.dir.file("blocks.gguf"), "gemma3.block_count", 4 /*U32*/, &blocks);
  expect_error(run_topkv("generate -m " + f.dir.file("blocks.gguf") + " -p hi -n 1"), "block_count = 2147483647");

  // Inf in a pack's sink values, re-sealed past its checksum.
  const std::string pack = f.pack("p.tkv");
  std::string bytes = test::slurp(pack);
  std::string name, old_sum;
  {
    SafetensorsReader st(pack);
    for (const TensorInfo& t : st.tensors())
      if (t.name.ends_with("sinks_v") && t.numel() > 0) name = t.name;
  }
  REQUIRE(!name.empty());
  {
    SafetensorsReader st(pack);
    const TensorInfo& t = st.get(name);
    const size_t data_start = bytes.size() - (size_t)st.tensors().back().end;
    const size_t off = data_start + (size_t)t.begin;
    old_sum = fmt::format("{:016x}", checksum64(bytes.data() + off, t.nbytes()));
    const float inf = INFINITY;
    std::memcpy(bytes.data() + off, &inf, 4);
    const std::string new_sum = fmt::format("{:016x}", checksum64(bytes.data() + off, t.nbytes()));
    const size_t at = bytes.find(old_sum);
    REQUIRE(at != std::string::npos);
    bytes.replace(at, 16, new_sum);
  }
  write_file(f.dir.file("inf.tkv"), bytes);
  expect_error(run_topkv("index info --verify " + f.dir.file("inf.tkv")), "holds inf");
  expect_error(run_topkv("generate --pack " + f.dir.file("inf.tkv") + " -m " + f.model + " -n 2"), "holds inf");

  // A NaN key in a KV dump (no checksums there): refused, not `nan` metrics.
  const std::string dump = f.dir.file("kv.safetensors");
  REQUIRE(run_topkv("bench recall --synthetic --n-keys 3000 --head-dim 64 --queries 4 --index flat --quiet "
                    "--save-dump " + dump).rc == 0);
  std::string d = test::slurp(dump);
  {
    SafetensorsReader st(dump);
    const TensorInfo& t = st.get("layer0.keys");
    const size_t off = d.size() - (size_t)st.tensors().back().end + (size_t)t.begin + 2 * 777;
    const uint16_t nan16 = t.dtype == StDType::F16 ? 0x7e00 : 0x7fc0;  // f16 / bf16 NaN
    std::memcpy(d.data() + off, &nan16, 2);
  }
  write_file(dump, d);
  expect_error(run_topkv("bench recall --dump " + dump + " --index flat --quiet"), "the keys of KV head 0 hold nan");
}

TEST_CASE("hostile: output paths are checked before the work") {
  Files f;
  // A missing folder is created (as the brief says outputs' folders are).
  auto r = run_topkv("index build -m " + f.model + " -f " + f.doc + " -o " + f.dir.file("a/b/p.tkv") +
                     " --window 4 --sinks 2 -q --json " + f.dir.file("c/d/x.json"));
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(fs::exists(f.dir.file("c/d/x.json")));
  // A folder that cannot exist (under a regular file): refused before the build, no pack.
  r = run_topkv("index build -m " + f.model + " -f " + f.doc + " -o " + f.dir.file("p.tkv") + " -q --json " +
                f.doc + "/x.json");
  expect_error(r, "--json statistics");
  CHECK_FALSE(fs::exists(f.dir.file("p.tkv")));
  // The output is a folder.
  expect_error(run_topkv("index build -m " + f.model + " -f " + f.doc + " -o " + f.dir.dir.string() + " -q"),
               "is a folder");
  expect_error(run_topkv("kv dump -m " + f.model + " -f " + f.doc + " -o " + f.doc + "/dump.safetensors"),
               "KV dump");
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(f.dir.file("ro"));
    fs::permissions(f.dir.file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    expect_error(run_topkv(f.gen("--json " + f.dir.file("ro/x.json"))), "not writable");
    fs::permissions(f.dir.file("ro"), fs::perms::owner_all);
  }
}

TEST_CASE("hostile: sizes past the memory this process may take are refused with the limit named") {
  // Synthetic recall data sized by the options alone.
  expect_error(run_topkv("bench recall --synthetic --n-keys 1000000000000 --quiet"), "of host memory");
  // Under an address-space limit: the limit is named, not std::bad_alloc.
  // (Not under AddressSanitizer: its shadow memory needs terabytes of address space.)
#if defined(__SANITIZE_ADDRESS__)
  return;
#endif
  const std::string bin = std::string(TOPKV_BINARY_DIR) + "/bin/topkv";
  test::TempDir d("topkv_hostile_as");
  const std::string err = d.file("err.txt");
  const int status = std::system(("ulimit -v 4000000; " + bin +
                                  " bench recall --synthetic --n-keys 20000000 --quiet --index flat 2>" + err +
                                  " >/dev/null")
                                     .c_str());
  const std::string e = test::slurp(err);
  INFO(e);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(e.find("RLIMIT_AS") != std::string::npos);
}
