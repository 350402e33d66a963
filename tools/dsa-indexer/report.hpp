// Text formatting shared by the commands' reports.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "json.hpp"

namespace dsa_cli {

// printf-style formatting into a std::string.
[[gnu::format(printf, 1, 2)]] std::string format(const char* pattern, ...);

// "12.3 us", "4.56 ms" or "1.23 s".
std::string format_time(double seconds);

// "812 MB/s", "4.27 TB/s" (decimal units).
std::string format_bandwidth(double bytes_per_second);
// "9.3 GFLOP/s", "1276 TFLOP/s".
std::string format_flop_rate(double flops_per_second);

// Named pass/fail checks with a one-line detail each.
class CheckList {
 public:
  // Records a check; the returned JSON object takes extra numbers.
  Json& add(const std::string& name, bool passed, const std::string& detail);
  bool all_passed() const;
  const Json& json() const { return json_; }
  void print(std::FILE* out) const;

 private:
  struct Entry {
    std::string name;
    bool passed;
    std::string detail;
  };
  std::vector<Entry> entries_;
  Json json_ = Json::array();
};

}  // namespace dsa_cli
