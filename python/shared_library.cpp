// Intentionally empty: CMake needs one source per library target. libflashattn.so for the Python
// package is the project's static library linked whole (python/CMakeLists.txt); its exported
// interface is the C API of include/flashattn/flashattn.h.
