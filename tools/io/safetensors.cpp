#include "io/safetensors.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

namespace flashattn::io {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("safetensors: " + what); }

// The header is capped like the reference implementation's (100 MB) so that a corrupt length
// cannot make us parse or allocate without bound.
constexpr uint64_t kMaxHeader = 100'000'000;

// The first 8 bytes as the little-endian header length (size >= 8).
uint64_t header_length(const uint8_t* bytes) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  return header_len;
}

std::size_t safetensors_item_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"I64", 8},  {"U64", 8}, {"F64", 8},    {"C64", 8},     {"F8_E8M0", 1}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
  }
  return "?";
}

// A tensor name as messages show it: control bytes (a NUL would end the printed message there)
// as \xNN, and at most 200 bytes.
std::string printable_name(const std::string& name) {
  std::string out;
  for (const char c : name.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
    } else {
      out += c;
    }
  }
  return name.size() > 200 ? out + "..." : out;
}

uint64_t as_offset(const nlohmann::json& j, const std::string& what) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
  const std::string got = j.is_number() ? j.dump() : std::string("a ") + j.type_name();
  fail(what + ": expected a non-negative integer, got " + got.substr(0, 40));
}

}  // namespace

bool starts_like_safetensors(const uint8_t* bytes, std::size_t size) {
  return size >= 9 && header_length(bytes) <= kMaxHeader && bytes[8] == '{';
}

std::optional<uint64_t> safetensors_file_size(const uint8_t* bytes, std::size_t size) {
  if (size < 8) return std::nullopt;
  const uint64_t header_len = header_length(bytes);
  if (header_len > kMaxHeader) return 0;
  if (size - 8 < header_len) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
    uint64_t end = 0;
    for (const auto& [name, info] : j.items()) {
      if (name == "__metadata__") continue;
      end = std::max(end, info.at("data_offsets").at(1).get<uint64_t>());
    }
    return end > UINT64_MAX - 8 - header_len ? 0 : 8 + header_len + end;
  } catch (const nlohmann::json::exception&) {
    return 0;  // SafetensorsFile says what is wrong with the header
  }
}

SafetensorsFile::SafetensorsFile(const uint8_t* bytes, std::size_t size) {
  if (size < 8) fail("truncated file (" + std::to_string(size) + " bytes): no 8-byte header length");
  const uint64_t header_len = header_length(bytes);
  if (header_len > kMaxHeader) fail("header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  if (header_len > size - 8) {
    fail("truncated header: header length " + std::to_string(header_len) + " but only " + std::to_string(size - 8) +
         " bytes follow");
  }
  const uint8_t* header = bytes + 8;
  data_ = header + header_len;
  const uint64_t data_size = size - 8 - header_len;

  nlohmann::json j;
  // A JSON object keeps the last of two equal keys; a header that repeats a key (a tensor's name,
  // or a field inside one tensor's entry) is refused instead, as the safetensors reference
  // implementation does, so that which data a name means never depends on the parser.
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  int duplicate_depth = 0;
  const auto no_duplicates = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    else if (event == E::object_end && !keys.empty()) keys.pop_back();
    else if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
             duplicate.empty()) {
      duplicate = parsed.get<std::string>();
      duplicate_depth = depth;
    }
    return true;
  };
  try {
    j = nlohmann::json::parse(header, header + header_len, no_duplicates);
  } catch (const nlohmann::json::exception& e) {
    // The parser quotes its whole last token, which can be most of a 100 MB header.
    const std::string what = e.what();
    fail("malformed JSON header: " + (what.size() > 300 ? what.substr(0, 300) + "..." : what));
  }
  if (!duplicate.empty()) {
    fail(duplicate_depth == 1 ? "the header names tensor '" + printable_name(duplicate) + "' twice"
                              : "the header repeats the key '" + printable_name(duplicate) + "' inside an entry");
  }
  if (!j.is_object()) fail("malformed header: expected a JSON object, got " + std::string(j.type_name()));

  std::vector<std::pair<std::string, const Entry*>> by_offset;
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") {
      // Free-form, but of the format's shape: string keys to string values.
      bool strings = info.is_object();
      if (strings)
        for (const auto& value : info) strings = strings && value.is_string();
      if (!strings) fail("'__metadata__': expected an object of string values");
      continue;
    }
    const std::string what = "tensor '" + printable_name(name) + "'";
    if (!info.is_object()) fail(what + ": expected an object with dtype, shape, data_offsets");
    const auto dt = info.find("dtype");
    const auto sh = info.find("shape");
    const auto off = info.find("data_offsets");
    if (dt == info.end() || !dt->is_string()) fail(what + ": missing or non-string 'dtype'");
    if (sh == info.end() || !sh->is_array()) fail(what + ": missing or non-array 'shape'");
    if (off == info.end() || !off->is_array() || off->size() != 2) fail(what + ": 'data_offsets' must be [begin, end]");
    Entry e;
    e.dtype = dt->get<std::string>();
    // An unknown dtype (a newer format revision, e.g. sub-byte floats) cannot be size-checked; its
    // offsets are still checked, and get() refuses it.
    const std::size_t item = safetensors_item_size(e.dtype);
    if (e.dtype.empty() || e.dtype.size() > 32) fail(what + ": malformed dtype");
    if (sh->size() > 32) fail(what + ": shape has more than 32 dimensions");
    for (const auto& d : *sh) {
      const uint64_t v = as_offset(d, what + " shape");
      if (v > (uint64_t{1} << 62)) fail(what + ": shape dimension " + std::to_string(v) + " is too large");
      e.shape.push_back(static_cast<int64_t>(v));
    }
    e.begin = as_offset((*off)[0], what + " data_offsets");
    e.end = as_offset((*off)[1], what + " data_offsets");
    const uint64_t nbytes = checked_byte_size(e.shape, item ? item : 1, "safetensors: " + what);
    if (e.begin > e.end || e.end > data_size) {
      fail(what + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
           "] outside the data buffer of " + std::to_string(data_size) + " bytes");
    }
    if (item != 0 && e.end - e.begin != nbytes) {
      fail(what + ": data_offsets span " + std::to_string(e.end - e.begin) + " bytes, shape " + shape_string(e.shape) +
           " of " + e.dtype + " needs " + std::to_string(nbytes));
    }
    by_offset.emplace_back(name, &entries_.emplace(name, std::move(e)).first->second);
  }
  // The tensors tile the data buffer exactly, in offset order (the reference implementation's
  // rule): an overlap, a gap or bytes past the last tensor mean offsets or the header length are
  // wrong, and a header length a few bytes short of its padding would otherwise shift every
  // tensor's data without an error.
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
  });
  uint64_t covered = 0;
  std::string previous;
  for (const auto& [name, e] : by_offset) {
    if (e->begin < covered) {
      fail("tensors '" + printable_name(previous) + "' and '" + printable_name(name) +
           "' have overlapping data_offsets");
    }
    if (e->begin > covered) {
      fail("tensor '" + printable_name(name) + "' starts at byte " + std::to_string(e->begin) + " of the data buffer, " +
           "expected " + std::to_string(covered) + " (the tensors must follow each other without gaps)");
    }
    covered = e->end;
    previous = name;
  }
  if (covered != data_size) {
    fail("the data buffer holds " + std::to_string(data_size) + " bytes, the tensors " + std::to_string(covered) +
         " (a wrong header length, or bytes past the last tensor)");
  }
}

HostTensor SafetensorsFile::get(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string names;
    for (const auto& [n, e] : entries_) names += (names.empty() ? "" : ", ") + printable_name(n);
    fail("no tensor named '" + printable_name(name) + "' (the file has: " + (names.empty() ? "none" : names) + ")");
  }
  const Entry& e = it->second;
  HostTensor t;
  if (e.dtype == "F32") t.dtype = DType::f32;
  else if (e.dtype == "F16") t.dtype = DType::f16;
  else if (e.dtype == "BF16") t.dtype = DType::bf16;
  else if (e.dtype == "I32") t.dtype = DType::i32;
  else
    fail("tensor '" + printable_name(name) + "' has dtype " + printable_name(e.dtype) +
         ", expected F32, F16, BF16 or I32");
  t.shape = e.shape;
  t.data.assign(data_ + e.begin, data_ + e.end);
  return t;
}

std::vector<uint8_t> write_safetensors(const std::vector<std::pair<std::string, const HostTensor*>>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || !seen.insert(name).second) fail("cannot write two tensors named '" + name + "'");
    const uint64_t nbytes = checked_byte_size(t->shape, element_size(t->dtype), "safetensors: tensor '" + name + "'");
    if (nbytes != t->data.size()) fail("tensor '" + name + "': data size does not match its shape");
    header[name] = {{"dtype", safetensors_dtype(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data buffer 8-byte aligned
  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& [name, t] : tensors) out.insert(out.end(), t->data.begin(), t->data.end());
  return out;
}

}  // namespace flashattn::io
