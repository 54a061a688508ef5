// NumPy .npy files (format versions 1.0, 2.0 and 3.0; numpy/lib/format.py documents the layout):
//   "\x93NUMPY" major minor, header length (uint16 LE for 1.0, uint32 LE for 2.0/3.0),
//   a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
//   spaces and ended by '\n', then the array bytes in C order.
// Supported element types: '<f4' (f32), '<f2' (f16), '<i4' (i32). .npy has no bfloat16: bf16
// tensors go in .safetensors files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "io/host_tensor.hpp"

namespace flashattn::io {

// Whether bytes start with the .npy magic "\x93NUMPY" (the first thing read_npy checks).
bool has_npy_magic(const uint8_t* bytes, std::size_t size);

// The byte size of the whole .npy file that bytes[0, size) begins, from its header: nullopt while
// the header is incomplete, 0 when it is malformed (read_npy says how). Lets a stream be read no
// further than its header says.
std::optional<uint64_t> npy_file_size(const uint8_t* bytes, std::size_t size);

// Parses a whole .npy file. Throws flashattn::Error for a truncated or malformed header, an
// unsupported or big-endian dtype, fortran_order True, an overflowing shape, or a data length that
// differs from the shape's byte size.
HostTensor read_npy(const uint8_t* bytes, std::size_t size);

// Serializes to .npy (version 1.0, or 2.0 when the header does not fit in 64 KiB). bf16 throws.
std::vector<uint8_t> write_npy(const HostTensor& tensor);

}  // namespace flashattn::io
