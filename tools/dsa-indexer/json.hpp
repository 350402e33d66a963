// A small JSON document builder for the tool's machine-readable output.
#pragma once

#include <concepts>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dsa_cli {

class Json {
 public:
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;  // keeps insertion order

  Json() = default;  // null
  Json(bool value) : value_(value) {}
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Json(T value) : value_(static_cast<double>(value)) {}
  Json(double value) : value_(value) {}
  Json(const char* value) : value_(std::string(value)) {}
  Json(std::string value) : value_(std::move(value)) {}

  static Json array() { Json j; j.value_ = Array{}; return j; }
  static Json object() { Json j; j.value_ = Object{}; return j; }

  // Appends to an array (a null becomes an empty array first).
  Json& push(Json value);
  // Sets a member of an object (a null becomes an empty object first);
  // returns the stored member.
  Json& set(const std::string& key, Json value);

  // Pretty-printed text with two-space indentation. Non-finite numbers are
  // written as null (JSON has no infinities or NaN).
  std::string dump() const;

 private:
  void write(std::string& out, int indent) const;

  std::variant<std::monostate, bool, double, std::string, Array, Object> value_;
};

}  // namespace dsa_cli

namespace dsa_cli {

// Writes `document` to `file`, or to standard output when `file` is empty;
// false with *error set when the file cannot be written.
bool write_json(const Json& document, const std::string& file, std::string* error);

}  // namespace dsa_cli
