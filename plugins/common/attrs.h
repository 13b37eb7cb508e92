// Op attributes as the Python specs define them (deployfuse/ops/defs/*.py). The per-op tables
// (spec::<Op>::kAttrs, in the generated deployfuse_op_specs.h) are written from those specs
// when the plugins build, so names, kinds, defaults and allowed values cannot drift; each
// runtime adapter reads a node's values through AttrValues::read with its own lookup.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace deployfuse {

enum class AttrKind : int { kInt, kFloat, kString };

// One attribute: its default (number or text) unless required; choices = "a|b|c" or nullptr.
struct AttrSpec {
  const char* name;
  AttrKind kind;
  double number;
  const char* text;
  bool required;
  const char* choices;
};

// The values of one node's attributes, in the order of its op's AttrSpecs.
class AttrValues {
 public:
  // lookup(spec, &number, &text) -> true when the node gives the attribute (fills one of the two).
  // Throws std::invalid_argument naming a missing required attribute or a value not allowed.
  template <size_t N, typename Lookup>
  static AttrValues read(const AttrSpec (&specs)[N], Lookup&& lookup) {
    AttrValues a;
    for (const AttrSpec& spec : specs) {
      double number = spec.number;
      std::string text = spec.text ? spec.text : "";
      if (!lookup(spec, &number, &text) && spec.required)
        throw std::invalid_argument(std::string("attribute '") + spec.name + "' is required");
      if (spec.choices != nullptr && !allowed(spec, number, text))
        throw std::invalid_argument(std::string(spec.name) + "='" + shown(spec, number, text) + "' is not one of " + spec.choices);
      a.specs_.push_back(spec);
      a.numbers_.push_back(number);
      a.texts_.push_back(spec.kind == AttrKind::kString ? text : std::string());
    }
    return a;
  }

  size_t size() const { return specs_.size(); }
  const AttrSpec& spec(size_t i) const { return specs_.at(i); }
  int64_t integer(size_t i) const { return static_cast<int64_t>(numbers_.at(i)); }
  float real(size_t i) const { return static_cast<float>(numbers_.at(i)); }
  const std::string& text(size_t i) const { return texts_.at(i); }

 private:
  static std::string shown(const AttrSpec& spec, double number, const std::string& text) {
    if (spec.kind == AttrKind::kString) return text;
    char buf[32];
    std::snprintf(buf, sizeof(buf), spec.kind == AttrKind::kInt ? "%.0f" : "%g", number);
    return buf;
  }
  static bool allowed(const AttrSpec& spec, double number, const std::string& text) {
    const std::string value = shown(spec, number, text);
    for (const char* p = spec.choices; *p != '\0';) {
      const char* end = std::strchr(p, '|');
      const size_t len = end ? static_cast<size_t>(end - p) : std::strlen(p);
      if (value.size() == len && value.compare(0, len, p, len) == 0) return true;
      p += len + (end ? 1 : 0);
    }
    return false;
  }

  std::vector<AttrSpec> specs_;
  std::vector<double> numbers_;
  std::vector<std::string> texts_;
};

}  // namespace deployfuse
