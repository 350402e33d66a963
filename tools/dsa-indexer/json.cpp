#include "json.hpp"

#include <cmath>
#include <cstdio>

namespace dsa_cli {
namespace {

void write_string(std::string& out, const std::string& text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void write_number(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char text[32];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(text, sizeof text, "%.0f", value);
  } else {
    std::snprintf(text, sizeof text, "%.6g", value);
  }
  out += text;
}

void newline(std::string& out, int indent) {
  out += '\n';
  out.append(static_cast<std::size_t>(indent) * 2, ' ');
}

}  // namespace

Json& Json::push(Json value) {
  if (std::holds_alternative<std::monostate>(value_)) value_ = Array{};
  auto& array = std::get<Array>(value_);
  array.push_back(std::move(value));
  return array.back();
}

Json& Json::set(const std::string& key, Json value) {
  if (std::holds_alternative<std::monostate>(value_)) value_ = Object{};
  auto& object = std::get<Object>(value_);
  for (auto& [name, member] : object) {
    if (name == key) {
      member = std::move(value);
      return member;
    }
  }
  object.emplace_back(key, std::move(value));
  return object.back().second;
}

std::string Json::dump() const {
  std::string out;
  write(out, 0);
  out += '\n';
  return out;
}

void Json::write(std::string& out, int indent) const {
  if (std::holds_alternative<std::monostate>(value_)) {
    out += "null";
  } else if (const bool* flag = std::get_if<bool>(&value_)) {
    out += *flag ? "true" : "false";
  } else if (const double* number = std::get_if<double>(&value_)) {
    write_number(out, *number);
  } else if (const std::string* text = std::get_if<std::string>(&value_)) {
    write_string(out, *text);
  } else if (const Array* array = std::get_if<Array>(&value_)) {
    if (array->empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (std::size_t i = 0; i < array->size(); ++i) {
      if (i > 0) out += ',';
      newline(out, indent + 1);
      (*array)[i].write(out, indent + 1);
    }
    newline(out, indent);
    out += ']';
  } else {
    const Object& object = std::get<Object>(value_);
    if (object.empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (std::size_t i = 0; i < object.size(); ++i) {
      if (i > 0) out += ',';
      newline(out, indent + 1);
      write_string(out, object[i].first);
      out += ": ";
      object[i].second.write(out, indent + 1);
    }
    newline(out, indent);
    out += '}';
  }
}

}  // namespace dsa_cli

namespace dsa_cli {

bool write_json(const Json& document, const std::string& file, std::string* error) {
  const std::string text = document.dump();
  if (file.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  }
  std::FILE* out = std::fopen(file.c_str(), "w");
  if (out == nullptr) {
    *error = "--json: cannot open '" + file + "' for writing";
    return false;
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  const bool closed = std::fclose(out) == 0;
  if (!written || !closed) *error = "--json: failed writing '" + file + "'";
  return written && closed;
}

}  // namespace dsa_cli
