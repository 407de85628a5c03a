// What the benchmarks' reports share: atomic text files (a failed run never
// leaves a half-written result), CSV quoting, and running a plotting script of
// scripts/ with the system python.
#pragma once
#include <string>
#include <vector>

namespace topkv {

// Writes `text` to path.tmp, then renames it over `path`. Throws Error.
void write_text_atomic(const std::string& path, const std::string& text);
// A CSV field, quoted when it holds a comma, quote or newline.
std::string csv_field(const std::string& s);

// Runs `python scripts/<script> args...`. The interpreter is $TOPKV_PYTHON or
// /usr/bin/python3; the script is $<script_env> when set, else scripts/<script>
// found next to the source tree the binary was built in, else under the
// current directory. Throws Error when the script cannot be found or fails
// (`results` names the file whose data it was plotting, for the message).
void run_plot_script(const std::string& script, const char* script_env, const std::vector<std::string>& args,
                     const std::string& results);

}  // namespace topkv
