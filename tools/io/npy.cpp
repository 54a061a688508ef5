#include "io/npy.hpp"

#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace flashattn::io {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;

[[noreturn]] void fail(const std::string& what) { throw Error("npy: " + what); }

// A strict parser for the header's Python dict literal: exactly the keys descr, fortran_order and
// shape, each once; string, bool and tuple-of-int values; optional trailing commas; nothing else.
// numpy evaluates the header with ast.literal_eval; we accept the subset numpy itself writes.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  void parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    expect('{');
    for (;;) {
      skip_ws();
      if (peek() == '}') { ++pos_; break; }
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (have_descr) fail("header has the key 'descr' twice");
        descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_order) fail("header has the key 'fortran_order' twice");
        fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        if (have_shape) fail("header has the key 'shape' twice");
        shape = parse_shape();
        have_shape = true;
      } else {
        fail("header has an unexpected key '" + key + "' (expected descr, fortran_order, shape)");
      }
      skip_ws();
      if (peek() == ',') { ++pos_; continue; }
      if (peek() == '}') { ++pos_; break; }
      fail_here("',' or '}'");
    }
    // numpy pads the header with spaces and ends it with '\n'.
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c != ' ' && c != '\n' && c != '\t' && c != '\r') fail("header has trailing characters after '}'");
    }
    if (!have_descr) fail("header lacks the key 'descr'");
    if (!have_order) fail("header lacks the key 'fortran_order'");
    if (!have_shape) fail("header lacks the key 'shape'");
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  [[noreturn]] void fail_here(const char* expected) {
    if (pos_ >= s_.size()) fail(std::string("header ends early: expected ") + expected);
    fail(std::string("malformed header at offset ") + std::to_string(pos_) + ": expected " + expected);
  }
  void expect(char c) {
    if (peek() != c || pos_ >= s_.size()) fail_here((std::string("'") + c + "'").c_str());
    ++pos_;
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail_here("a quoted string");
    ++pos_;
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      const char c = s_[pos_];
      if (c == '\\' || c == '\n' || pos_ - start > 64) fail("malformed header: unsupported string literal");
      ++pos_;
    }
    if (pos_ >= s_.size()) fail("header ends inside a string");
    return std::string(s_.substr(start, pos_++ - start));
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") { pos_ += 4; return true; }
    if (s_.substr(pos_, 5) == "False") { pos_ += 5; return false; }
    fail_here("True or False");
  }
  int64_t parse_int() {
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    const std::size_t len = pos_ - start;
    if (len == 0) fail_here("a non-negative integer");
    if (len > 1 && s_[start] == '0') fail("malformed header: integer with a leading zero");
    if (len > 18) fail("shape dimension " + std::string(s_.substr(start, len)) + " is too large");
    int64_t v = 0;
    for (std::size_t i = start; i < pos_; ++i) v = v * 10 + (s_[i] - '0');
    return v;
  }
  // Python tuple syntax: () for a scalar, (n,) for 1-D, (a, b) or (a, b,) otherwise.
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    skip_ws();
    if (peek() == ')') { ++pos_; return shape; }
    bool trailing_comma = false;
    for (;;) {
      shape.push_back(parse_int());
      if (shape.size() > 32) fail("shape has more than 32 dimensions");
      skip_ws();
      trailing_comma = false;
      if (peek() == ',') {
        ++pos_;
        trailing_comma = true;
        skip_ws();
        if (peek() == ')') break;
        continue;
      }
      if (peek() == ')') break;
      fail_here("',' or ')' in shape");
    }
    ++pos_;
    if (shape.size() == 1 && !trailing_comma) fail("malformed header: shape (n) is not a tuple, expected (n,)");
    return shape;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

std::optional<DType> dtype_from_descr(const std::string& descr) {
  if (descr == "<f4") return DType::f32;
  if (descr == "<f2") return DType::f16;
  if (descr == "<i4") return DType::i32;
  return std::nullopt;
}

const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::i32: return "<i4";
    case DType::bf16: break;
  }
  return nullptr;
}

uint32_t read_le(const uint8_t* p, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

bool has_npy_magic(const uint8_t* bytes, std::size_t size) {
  return size >= kMagicLen && std::memcmp(bytes, kMagic, kMagicLen) == 0;
}

namespace {

struct NpyHeader {
  HostTensor tensor;  // dtype and shape; no data
  std::string descr;
  uint64_t nbytes = 0;
  std::size_t data_start = 0;
};

// Everything up to the array bytes; throws as read_npy does.
NpyHeader parse_npy_header(const uint8_t* bytes, std::size_t size) {
  if (!has_npy_magic(bytes, size)) {
    fail(size < kMagicLen ? "truncated file (" + std::to_string(size) + " bytes): not an .npy file"
                          : "not an .npy file (missing the \\x93NUMPY magic)");
  }
  if (size < kMagicLen + 2) fail("truncated file: no format version");
  const int major = bytes[6], minor = bytes[7];
  if (minor != 0 || major < 1 || major > 3) {
    fail("unsupported format version " + std::to_string(major) + "." + std::to_string(minor) +
         " (expected 1.0, 2.0 or 3.0)");
  }
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (size < kMagicLen + 2 + len_bytes) fail("truncated file: no header length");
  const std::size_t header_len = read_le(bytes + 8, static_cast<int>(len_bytes));
  const std::size_t header_start = kMagicLen + 2 + len_bytes;
  if (header_len > size - header_start) {
    fail("truncated header: header length " + std::to_string(header_len) + " but only " +
         std::to_string(size - header_start) + " bytes follow");
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes + header_start), header_len);
  for (char c : header) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t' && c != '\r') || u >= 0x7f) {
      fail("header has a non-ASCII or control character");
    }
  }

  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  HeaderParser(header).parse(descr, fortran_order, shape);

  const std::optional<DType> dtype = dtype_from_descr(descr);
  if (!dtype) {
    if (!descr.empty() && descr[0] == '>') {
      fail("big-endian dtype '" + descr + "' is not supported (expected little-endian, e.g. '<f4')");
    }
    fail("unsupported dtype '" + descr +
         "' (expected '<f4' float32, '<f2' float16 or '<i4' int32; bf16 needs a .safetensors file)");
  }
  if (fortran_order) fail("fortran_order True is not supported (save a C-contiguous array)");

  NpyHeader h;
  h.tensor.dtype = *dtype;
  h.tensor.shape = shape;
  h.descr = descr;
  h.nbytes = checked_byte_size(shape, element_size(h.tensor.dtype), "npy");
  h.data_start = header_start + header_len;
  return h;
}

}  // namespace

std::optional<uint64_t> npy_file_size(const uint8_t* bytes, std::size_t size) {
  if (size < kMagicLen + 4) return std::nullopt;
  const std::size_t len_bytes = bytes[6] == 1 ? 2 : 4;
  if (size < kMagicLen + 2 + len_bytes) return std::nullopt;
  if (read_le(bytes + 8, static_cast<int>(len_bytes)) > size - (kMagicLen + 2 + len_bytes)) return std::nullopt;
  try {
    const NpyHeader h = parse_npy_header(bytes, size);
    return h.data_start + h.nbytes;
  } catch (const Error&) {
    return 0;  // read_npy will say what is wrong with the header
  }
}

HostTensor read_npy(const uint8_t* bytes, std::size_t size) {
  NpyHeader h = parse_npy_header(bytes, size);
  const uint64_t have = size - h.data_start;
  if (have != h.nbytes) {
    fail("wrong data length: shape " + shape_string(h.tensor.shape) + " of " + h.descr + " needs " +
         std::to_string(h.nbytes) + " bytes, the file has " + std::to_string(have));
  }
  h.tensor.data.assign(bytes + h.data_start, bytes + size);
  return std::move(h.tensor);
}

std::vector<uint8_t> write_npy(const HostTensor& tensor) {
  const char* descr = descr_of(tensor.dtype);
  if (!descr) throw Error("npy: bf16 cannot be stored in .npy (numpy has no bfloat16); use a .safetensors file");
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < tensor.shape.size(); ++i) {
    if (i) dict += ", ";
    dict += std::to_string(tensor.shape[i]);
  }
  dict += tensor.shape.size() == 1 ? ",), }" : "), }";
  if (checked_byte_size(tensor.shape, element_size(tensor.dtype), "npy") != tensor.data.size()) {
    throw Error("npy: tensor data size does not match its shape " + shape_string(tensor.shape));
  }
  // Pad with spaces so that the data starts at a multiple of 64 bytes, ending with '\n'.
  std::size_t len_bytes = 2;
  std::size_t prefix = kMagicLen + 2 + len_bytes;
  std::size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  if (total - prefix > 0xffff) {
    len_bytes = 4;
    prefix = kMagicLen + 2 + len_bytes;
    total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  }
  const std::size_t header_len = total - prefix;
  dict.append(header_len - dict.size() - 1, ' ');
  dict += '\n';

  std::vector<uint8_t> out(total + tensor.data.size());
  std::memcpy(out.data(), kMagic, kMagicLen);
  out[kMagicLen] = len_bytes == 2 ? 1 : 2;
  out[kMagicLen + 1] = 0;
  for (std::size_t i = 0; i < len_bytes; ++i) out[kMagicLen + 2 + i] = static_cast<uint8_t>(header_len >> (8 * i));
  std::memcpy(out.data() + prefix, dict.data(), dict.size());
  if (!tensor.data.empty()) std::memcpy(out.data() + total, tensor.data.data(), tensor.data.size());
  return out;
}

}  // namespace flashattn::io
