#include "bench/report_io.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/common/error.h"
#include "src/common/file_io.h"

extern char** environ;

namespace topkv {

namespace {

namespace fs = std::filesystem;

// Where scripts/<script> is, or "" (see the header for the order).
std::string find_script(const std::string& script, const char* script_env) {
  if (const char* env = script_env ? std::getenv(script_env) : nullptr) return env;
  std::vector<fs::path> candidates;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path build = exe.parent_path().parent_path();  // <build>/bin/topkv
    candidates.push_back(build.parent_path() / "scripts" / script);
    std::ifstream cache(build / "CMakeCache.txt");  // a build tree knows its sources
    for (std::string line; std::getline(cache, line);)
      if (line.rfind("CMAKE_HOME_DIRECTORY:INTERNAL=", 0) == 0)
        candidates.push_back(fs::path(line.substr(line.find('=') + 1)) / "scripts" / script);
  }
  candidates.push_back(fs::current_path(ec) / "scripts" / script);
  for (auto& c : candidates)
    if (fs::is_regular_file(c, ec)) return c.string();
  return "";
}

}  // namespace

void write_text_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text, "report");
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void run_plot_script(const std::string& script_name, const char* script_env, const std::vector<std::string>& args,
                     const std::string& results) {
  const std::string script = find_script(script_name, script_env);
  TOPKV_CHECK(!script.empty(),
              "cannot find scripts/{} (looked beside the build tree and under the current directory){}",
              script_name, script_env ? fmt::format(": set {} to its path", script_env) : std::string());
  const char* py_env = std::getenv("TOPKV_PYTHON");
  const std::string python = py_env ? py_env : "/usr/bin/python3";
  std::vector<std::string> all = {python, script};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  TOPKV_CHECK(rc == 0, "cannot run '{}' to plot: {} (set TOPKV_PYTHON to a python3 with matplotlib)", python,
              std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  TOPKV_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "plotting failed ({} {} exited with status {}); the results are in '{}'", python, script,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1, results);
}

}  // namespace topkv
