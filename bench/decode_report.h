// Output of the decode benchmark: a table for the terminal, CSV, JSON
// (schema: bench/decode_schema.json) and a plot drawn by
// scripts/plot_decode.py (tokens/s against context, one line per
// mode/index/backend; a stacked bar of each row's per-step split). Files are
// written atomically, as the recall benchmark's are.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/decode_bench.h"

namespace topkv {

void print_decode_table(const DecodeBenchResult& r, std::FILE* out);
void write_decode_csv(const DecodeBenchResult& r, const std::string& path);
nlohmann::ordered_json decode_json(const DecodeBenchResult& r);
void write_decode_json(const DecodeBenchResult& r, const std::string& path);
// Runs scripts/plot_decode.py (or $TOPKV_PLOT_DECODE_SCRIPT) on the JSON; throws Error when it fails.
void plot_decode_png(const std::string& json_path, const std::string& png_path);

}  // namespace topkv
