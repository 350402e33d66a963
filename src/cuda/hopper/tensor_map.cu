// Tensor-map encoding through the driver entry point the runtime hands out.
#include "cuda/hopper/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/cuda_check.hpp"

namespace dsa::detail::cuda::hopper {

namespace {

// The driver's entry point, looked up once for the process (the driver a
// process loaded does not change): a lookup per map was a runtime call on
// every launch path that encodes maps.
struct EncoderLookup {
  cudaError_t error = cudaSuccess;
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
};

EncoderLookup look_up_encoder() {
  EncoderLookup lookup;
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  lookup.error = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault,
                                                  &found);
  if (lookup.error != cudaSuccess) {
    cudaGetLastError();
  } else if (found == cudaDriverEntryPointSuccess) {
    lookup.encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }
  return lookup;
}

Status tensor_map_encoder(const char* op, PFN_cuTensorMapEncodeTiled_v12000* encode) {
  static const EncoderLookup lookup = look_up_encoder();
  DSA_RETURN_IF_ERROR(cuda_status(lookup.error, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)"));
  if (lookup.encode == nullptr) {
    return {ErrorCode::cuda_error, std::string(op) + ": the driver does not provide cuTensorMapEncodeTiled"};
  }
  *encode = lookup.encode;
  return Status::success();
}

Status encode_map(const char* op, const char* what, const void* base, int rank, const std::uint64_t* dims,
                  const std::uint64_t* strides, const std::uint32_t* box, CUtensorMapSwizzle swizzle,
                  CUtensorMap* map) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  DSA_RETURN_IF_ERROR(tensor_map_encoder(op, &encode));
  cuuint64_t map_dims[5];
  cuuint64_t map_strides[4];
  cuuint32_t map_box[5];
  cuuint32_t element_strides[5];
  for (int i = 0; i < rank; ++i) {
    map_dims[i] = dims[i];
    map_box[i] = box[i];
    element_strides[i] = 1;
    if (i + 1 < rank) map_strides[i] = strides[i];
  }
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, static_cast<cuuint32_t>(rank), const_cast<void*>(base),
             map_dims, map_strides, map_box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return {ErrorCode::cuda_error, std::string(op) + ": encoding the " + what + " tensor map failed (CUresult " +
                                       std::to_string(static_cast<int>(result)) + ")"};
  }
  return Status::success();
}

}  // namespace

Status encode_swizzled_map(const char* op, const char* what, const void* base, int rank,
                           const std::uint64_t* dims, const std::uint64_t* strides,
                           const std::uint32_t* box, CUtensorMap* map) {
  return encode_map(op, what, base, rank, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, map);
}

Status encode_plain_map(const char* op, const char* what, const void* base, int rank,
                        const std::uint64_t* dims, const std::uint64_t* strides,
                        const std::uint32_t* box, CUtensorMap* map) {
  return encode_map(op, what, base, rank, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE, map);
}

}  // namespace dsa::detail::cuda::hopper
