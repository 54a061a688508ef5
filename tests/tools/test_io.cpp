// The .npy and .safetensors readers and writers: round trips, and one test per malformed-file error
// (each must be a flashattn::Error naming the problem, never a crash).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <random>
#include <string>

#include "io/npy.hpp"
#include "io/safetensors.hpp"

namespace flashattn::io {
namespace {

using Bytes = std::vector<uint8_t>;

HostTensor random_tensor(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(static_cast<std::size_t>(t.numel()) * element_size(dtype));
  std::mt19937 rng(std::random_device{}());
  for (auto& b : t.data) b = static_cast<uint8_t>(rng());
  return t;
}

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

// An .npy file with a hand-written header dict (padded to 64 like numpy) and `data_len` data bytes.
Bytes npy_with_header(const std::string& dict, std::size_t data_len, int major = 1) {
  std::string header = dict;
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  Bytes out = bytes_of(std::string("\x93NUMPY", 6));
  out.push_back(static_cast<uint8_t>(major));
  out.push_back(0);
  const std::size_t n = header.size();
  for (std::size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_len, 0x3c);
  return out;
}

void expect_npy_error(const Bytes& b, const std::string& needle) {
  try {
    read_npy(b.data(), b.size());
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "multi-line: " << e.what();
  }
}

TEST(Npy, RoundTripsEveryDtypeAndRank) {
  for (DType dt : {DType::f32, DType::f16, DType::i32}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {7}, {3, 5}, {2, 3, 4, 5}, {0, 4}, {2, 0, 3}}) {
      const HostTensor t = random_tensor(dt, shape);
      const Bytes file = write_npy(t);
      EXPECT_EQ((file.size() - t.data.size()) % 64, 0u) << "header padded to 64";
      const HostTensor r = read_npy(file.data(), file.size());
      EXPECT_EQ(r.dtype, t.dtype);
      EXPECT_EQ(r.shape, t.shape);
      EXPECT_EQ(r.data, t.data);
    }
  }
}

TEST(Npy, ReadsVersion2And3AndDoubleQuotes) {
  for (int major : {2, 3}) {
    const Bytes b = npy_with_header("{\"descr\": \"<f2\", \"fortran_order\": False, \"shape\": (2, 3)}", 12, major);
    const HostTensor t = read_npy(b.data(), b.size());
    EXPECT_EQ(t.dtype, DType::f16);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  }
  const Bytes b = npy_with_header("{'shape': (4,), 'fortran_order': False, 'descr': '<i4',}", 16);
  EXPECT_EQ(read_npy(b.data(), b.size()).shape, (std::vector<int64_t>{4}));
}

TEST(Npy, RefusesBf16) {
  EXPECT_THROW(write_npy(random_tensor(DType::bf16, {2})), Error);
}

TEST(Npy, MalformedFiles) {
  const std::string ok_tail = "'fortran_order': False, 'shape': (2, 2), }";
  expect_npy_error({}, "truncated file");
  expect_npy_error(bytes_of("hello world, not npy"), "magic");
  expect_npy_error(bytes_of(std::string("\x93NUMPY\x01", 7)), "no format version");
  expect_npy_error(bytes_of(std::string("\x93NUMPY\x01\x00\x10", 9)), "no header length");
  expect_npy_error(bytes_of(std::string("\x93NUMPY\x04\x00\x10\x00", 10)), "unsupported format version 4.0");
  expect_npy_error(bytes_of(std::string("\x93NUMPY\x01\x00\xff\x00{'descr'", 17)), "truncated header");
  expect_npy_error(npy_with_header("{'descr': '<f4', " + ok_tail, 15), "wrong data length");
  expect_npy_error(npy_with_header("{'descr': '<f4', " + ok_tail, 17), "wrong data length");
  expect_npy_error(npy_with_header("{'descr': '<f8', " + ok_tail, 32), "unsupported dtype '<f8'");
  expect_npy_error(npy_with_header("{'descr': '<V2', " + ok_tail, 8), "bf16 needs a .safetensors");
  expect_npy_error(npy_with_header("{'descr': '>f4', " + ok_tail, 16), "big-endian");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16), "fortran_order");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'shape': (2, 2), }", 16), "lacks the key 'fortran_order'");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'descr': '<f4', " + ok_tail, 16), "twice");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'extra': 1, " + ok_tail, 16), "unexpected key 'extra'");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4), }", 16), "not a tuple");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 16),
                   "non-negative integer");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (04,), }", 16), "leading zero");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }", 16), "expected");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }", 16),
                   "overflows");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 16),
                   "too large");
  expect_npy_error(npy_with_header("{'descr': '<f4', " + ok_tail + " x", 16), "trailing characters");
  expect_npy_error(npy_with_header("{'descr': '<f4, 'fortran_order': False}", 16), "expected");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': Fals", 16), "True or False");
  expect_npy_error(npy_with_header("{'descr': '\xc3\xa9', " + ok_tail, 16), "non-ASCII");
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2)", 16), "',' or '}'");
}

TEST(Npy, EveryTruncationOfAValidFileFailsCleanly) {
  const Bytes file = write_npy(random_tensor(DType::f32, {3, 4}));
  for (std::size_t n = 0; n < file.size(); ++n) {
    EXPECT_THROW(read_npy(file.data(), n), Error) << "prefix of " << n << " bytes";
  }
}

// ---- safetensors ----

Bytes safetensors_with_header(const std::string& json, std::size_t data_len) {
  Bytes out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(json.size()) >> (8 * i)));
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + data_len, 0x3c);
  return out;
}

void expect_st_error(const Bytes& b, const std::string& needle, const std::string& get = "") {
  try {
    SafetensorsFile f(b.data(), b.size());
    if (!get.empty()) f.get(get);
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "multi-line: " << e.what();
  }
}

TEST(Safetensors, RoundTripsSeveralTensors) {
  const HostTensor q = random_tensor(DType::bf16, {1, 5, 2, 8});
  const HostTensor lse = random_tensor(DType::f32, {1, 2, 5});
  const HostTensor cu = random_tensor(DType::i32, {3});
  const HostTensor h = random_tensor(DType::f16, {0, 3});
  const Bytes file = write_safetensors({{"q", &q}, {"lse", &lse}, {"cu_seqlens_q", &cu}, {"empty", &h}});
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  SafetensorsFile f(file.data(), file.size());
  EXPECT_EQ(f.entries().size(), 4u);
  for (const auto& [name, t] : std::vector<std::pair<std::string, const HostTensor*>>{
           {"q", &q}, {"lse", &lse}, {"cu_seqlens_q", &cu}, {"empty", &h}}) {
    const HostTensor r = f.get(name);
    EXPECT_EQ(r.dtype, t->dtype) << name;
    EXPECT_EQ(r.shape, t->shape) << name;
    EXPECT_EQ(r.data, t->data) << name;
  }
  EXPECT_TRUE(f.contains("lse"));
  EXPECT_FALSE(f.contains("k"));
}

TEST(Safetensors, IgnoresMetadataAndReportsMissingNames) {
  const Bytes b = safetensors_with_header(
      R"({"__metadata__": {"format": "pt"}, "k": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8);
  SafetensorsFile f(b.data(), b.size());
  EXPECT_EQ(f.entries().size(), 1u);
  expect_st_error(b, "no tensor named 'q' (the file has: k)", "q");
}

TEST(Safetensors, MalformedFiles) {
  expect_st_error({1, 2, 3}, "truncated file");
  {
    const Bytes empty = safetensors_with_header("{}", 0);
    EXPECT_TRUE(SafetensorsFile(empty.data(), empty.size()).entries().empty());
  }
  Bytes big = safetensors_with_header("{}", 0);
  big[7] = 0x7f;
  expect_st_error(big, "exceeds the 100 MB limit");
  Bytes len = safetensors_with_header("{}", 0);
  len[0] = 40;
  expect_st_error(len, "truncated header");
  expect_st_error(safetensors_with_header("{\"q\": ", 0), "malformed JSON header");
  expect_st_error(safetensors_with_header("[1, 2]", 0), "expected a JSON object");
  expect_st_error(safetensors_with_header(R"({"q": 3})", 0), "expected an object");
  expect_st_error(safetensors_with_header(R"({"q": {"shape": [1], "data_offsets": [0, 4]}})", 4), "'dtype'");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F32", "data_offsets": [0, 4]}})", 4), "'shape'");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F32", "shape": [1]}})", 4), "data_offsets");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4),
                  "has dtype F33", "q");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "", "shape": [1], "data_offsets": [0, 4]}})", 4),
                  "malformed dtype");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
                  "non-negative integer");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4]}})", 4),
                  "non-negative integer");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
                  "outside the data buffer");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", 4),
                  "outside the data buffer");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4),
                  "needs 8");
  expect_st_error(safetensors_with_header(
                      R"({"q": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "k": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}})",
                      8),
                  "overlapping");
  expect_st_error(
      safetensors_with_header(
          R"({"q": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 4]}})", 4),
      "overflows");
  expect_st_error(safetensors_with_header(R"({"q": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8),
                  "has dtype F64, expected F32, F16, BF16 or I32", "q");
}

TEST(Safetensors, EveryTruncationOfAValidFileFailsCleanly) {
  const HostTensor q = random_tensor(DType::f32, {2, 3});
  const Bytes file = write_safetensors({{"q", &q}});
  for (std::size_t n = 0; n < file.size(); ++n) {
    EXPECT_THROW(SafetensorsFile(file.data(), n).get("q"), Error) << "prefix of " << n << " bytes";
  }
}

TEST(Files, ReadMissingFileAndWriteRoundTrip) {
  try {
    read_file("/nonexistent/dir/x.npy");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open '/nonexistent/dir/x.npy'"), std::string::npos);
  }
  EXPECT_THROW(write_file("/nonexistent/dir/x.npy", {1, 2}), Error);
  const std::string path = testing::TempDir() + "flashattn_io_test.bin";
  const Bytes data = {1, 2, 3, 255};
  write_file(path, data);
  EXPECT_EQ(read_file(path), data);
  std::remove(path.c_str());
  EXPECT_TRUE(is_safetensors_path("a/b.safetensors"));
  EXPECT_FALSE(is_safetensors_path("a/b.npy"));
}

TEST(HostTensor, ByteSizeOverflowAndView) {
  EXPECT_THROW(checked_byte_size({int64_t{1} << 31, int64_t{1} << 31, 4}, 4, "x"), Error);
  EXPECT_EQ(checked_byte_size({int64_t{1} << 40, 0}, 4, "x"), 0u);
  HostTensor t = random_tensor(DType::f16, {2, 3, 4});
  const TensorView v = t.view();
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.stride[0], 12);
  EXPECT_EQ(v.stride[2], 1);
  HostTensor t5 = random_tensor(DType::f32, {1, 1, 1, 1, 1});
  EXPECT_THROW(t5.view(), Error);
}

// Regression: an empty tensor with huge dimensions (0, 999999999999999999, 999999999999999999, 8)
// passed the readers (byte size 0) and then overflowed int64 in numel() and view()'s strides.
TEST(HostTensor, EmptyTensorWithHugeDimsIsRefused) {
  const int64_t huge = 999999999999999999;
  try {
    checked_byte_size({0, huge, huge, 8}, 4, "q");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q: shape [0, 999999999999999999, 999999999999999999, 8] has more "
                                         "elements than int64 can index"),
              std::string::npos)
        << e.what();
  }
  expect_npy_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 999999999999999999, "
                                   "999999999999999999, 8), }",
                                   0),
                   "more elements than int64 can index");
  HostTensor t;
  t.shape = {0, huge, huge, 8};
  EXPECT_THROW(t.view(), Error);
  t.shape = {huge, huge};
  EXPECT_THROW(t.numel(), Error);
  t.shape = {0, huge, 8};  // fits: numel 0, strides in range
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.view().stride[0], huge * 8);
}

// OutputFiles writes temporaries and renames them only on commit(); without commit() nothing is
// left behind, and a failed add() leaves no file either.
TEST(Files, OutputFilesAreAllOrNothing) {
  const std::string dir = testing::TempDir() + "flashattn_io_outputs_" + std::to_string(std::random_device{}());
  std::filesystem::create_directories(dir);
  const std::string a = dir + "/a.npy", b = dir + "/b.npy";
  auto count_files = [&] {
    const std::filesystem::directory_iterator files(dir);
    return std::distance(begin(files), end(files));
  };
  {
    OutputFiles files;
    files.add(a, {1, 2, 3});
    EXPECT_THROW(files.add(dir + "/missing/b.npy", {4}), Error);
  }
  EXPECT_EQ(count_files(), 0);
  {
    OutputFiles files;
    files.add(a, {1, 2, 3});
    files.add(b, {4, 5});
    EXPECT_EQ(count_files(), 2);  // the two temporaries
    files.commit();
  }
  EXPECT_EQ(read_file(a), (Bytes{1, 2, 3}));
  EXPECT_EQ(read_file(b), (Bytes{4, 5}));
  EXPECT_EQ(count_files(), 2);
  EXPECT_THROW(check_writable(dir + "/missing/c.npy"), Error);
  EXPECT_THROW(check_writable(dir), Error);
  EXPECT_NO_THROW(check_writable(dir + "/c.npy"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace flashattn::io
