// Output of the recall benchmark: a table for the terminal, CSV, JSON
// (schema: bench/recall_schema.json) and a recall-vs-QPS plot drawn by
// scripts/plot_recall.py. Files are written to a temporary name and renamed,
// so a failed run never leaves a half-written result.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/recall_bench.h"

namespace topkv {

void print_recall_table(const RecallBenchResult& r, std::FILE* out);
void write_recall_csv(const RecallBenchResult& r, const std::string& path);
nlohmann::ordered_json recall_json(const RecallBenchResult& r);
void write_recall_json(const RecallBenchResult& r, const std::string& path);

// Runs `python plot_recall.py --json JSON --out PNG --metric METRIC` (metric
// "recall" or "mass"). The interpreter is $TOPKV_PYTHON or /usr/bin/python3;
// the script is $TOPKV_PLOT_SCRIPT, else scripts/plot_recall.py found next to
// the source tree the binary was built in, else under the current directory.
// Throws Error when the script cannot be found or fails.
void plot_recall_png(const std::string& json_path, const std::string& png_path, const std::string& metric);

}  // namespace topkv
