#include "report.hpp"

#include <cstdarg>
#include <iterator>

namespace dsa_cli {

std::string format(const char* pattern, ...) {
  std::va_list args;
  va_start(args, pattern);
  std::va_list copy;
  va_copy(copy, args);
  const int length = std::vsnprintf(nullptr, 0, pattern, copy);
  va_end(copy);
  std::string text(static_cast<std::size_t>(length > 0 ? length : 0), '\0');
  if (length > 0) std::vsnprintf(text.data(), text.size() + 1, pattern, args);
  va_end(args);
  return text;
}

std::string format_time(double seconds) {
  if (seconds < 1e-3) return format("%.1f us", seconds * 1e6);
  if (seconds < 10) return format("%.2f ms", seconds * 1e3);
  return format("%.2f s", seconds);
}

namespace {

std::string with_decimal_prefix(double value, const char* unit) {
  static constexpr const char* kPrefixes[] = {"", "k", "M", "G", "T", "P"};
  std::size_t prefix = 0;
  while (value >= 1000 && prefix + 1 < std::size(kPrefixes)) {
    value /= 1000;
    ++prefix;
  }
  return format(value >= 100 ? "%.0f %s%s" : "%.3g %s%s", value, kPrefixes[prefix], unit);
}

}  // namespace

std::string format_bandwidth(double bytes_per_second) { return with_decimal_prefix(bytes_per_second, "B/s"); }

std::string format_flop_rate(double flops_per_second) { return with_decimal_prefix(flops_per_second, "FLOP/s"); }

Json& CheckList::add(const std::string& name, bool passed, const std::string& detail) {
  entries_.push_back({name, passed, detail});
  Json& entry = json_.push(Json::object());
  entry.set("name", name);
  entry.set("passed", passed);
  entry.set("detail", detail);
  return entry;
}

bool CheckList::all_passed() const {
  for (const Entry& entry : entries_) {
    if (!entry.passed) return false;
  }
  return true;
}

void CheckList::print(std::FILE* out) const {
  for (const Entry& entry : entries_) {
    std::fprintf(out, "  %s  %-22s %s\n", entry.passed ? "PASS" : "FAIL", entry.name.c_str(), entry.detail.c_str());
  }
}

}  // namespace dsa_cli
