# Finds minititan's system dependencies the CMake way, each with a message naming the Debian
# package to install when it is missing (scripts/setup.sh installs them all).
include(FindPackageMessage)

macro(mt_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR
      "minititan needs ${what}, which was not found.\n"
      "Install it with: apt-get install ${package}   (or run scripts/setup.sh as root)")
  endif()
endmacro()

find_package(Threads REQUIRED)

find_package(OpenMP QUIET)
mt_require(OpenMP_CXX_FOUND "OpenMP" "libgomp1 (part of g++)")

set(BLA_VENDOR OpenBLAS)
find_package(BLAS QUIET)
mt_require(BLAS_FOUND "OpenBLAS" "libopenblas-dev")
find_path(MT_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread openblas-openmp)
mt_require(MT_CBLAS_INCLUDE_DIR "the OpenBLAS cblas.h header" "libopenblas-dev")

# oneDNN runs the CPU's native bf16 GEMMs (runtime/cpu/bf16_gemm.h).
find_package(dnnl CONFIG QUIET)
mt_require(dnnl_FOUND "oneDNN" "libdnnl-dev")

find_package(absl CONFIG QUIET)
mt_require(absl_FOUND "Abseil" "libabsl-dev")

find_package(toml11 CONFIG QUIET)
mt_require(toml11_FOUND "toml11 (v3)" "libtoml11-dev")

set(HDF5_PREFER_PARALLEL OFF)
find_package(HDF5 QUIET COMPONENTS C)
mt_require(HDF5_FOUND "HDF5 (serial)" "libhdf5-dev")

# RocksDB keeps the rows of kv-backed embedding tables (runtime/sparse/kv/kv_store.h).
find_package(RocksDB CONFIG QUIET)
mt_require(RocksDB_FOUND "RocksDB" "librocksdb-dev")

find_package(MPI QUIET COMPONENTS CXX)
mt_require(MPI_CXX_FOUND "OpenMPI" "libopenmpi-dev openmpi-bin")

if(MT_BUILD_TESTS)
  find_package(GTest CONFIG QUIET)
  mt_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")
endif()
if(MT_BUILD_BENCH)
  find_package(benchmark CONFIG QUIET)
  mt_require(benchmark_FOUND "Google Benchmark" "libbenchmark-dev")
endif()

# CUDA is optional: built when nvcc is found (MT_CUDA=AUTO) or required (MT_CUDA=ON).
set(MT_HAVE_CUDA OFF)
if(NOT MT_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MT_HAVE_CUDA ON)
    set(CMAKE_CUDA_ARCHITECTURES 90)
    enable_language(CUDA)
    # CMake < 3.26 has no C++20 flag for nvcc (its compiler checks then fail on CUDA20).
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
  elseif(MT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MT_CUDA=ON but no nvcc was found; set CMAKE_CUDA_COMPILER or MT_CUDA=AUTO")
  endif()
endif()
message(STATUS "minititan: OpenBLAS ${BLAS_LIBRARIES}; HDF5 ${HDF5_VERSION}; MPI ${MPI_CXX_VERSION}; CUDA backend ${MT_HAVE_CUDA}")
