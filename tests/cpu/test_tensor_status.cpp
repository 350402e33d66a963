// Status, TensorView, names and the host-side device helpers.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>

#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

TEST(Status, DefaultIsOkAndCarriesCodeAndMessage) {
  const dsa::Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_TRUE(static_cast<bool>(ok));
  EXPECT_EQ(ok.code(), dsa::ErrorCode::ok);
  EXPECT_TRUE(ok.message().empty());
  EXPECT_EQ(ok.to_string(), "ok");
  EXPECT_TRUE(dsa::Status::success().ok());

  const dsa::Status bad(dsa::ErrorCode::bad_shape, "topk: logits: must be 2-D");
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(static_cast<bool>(bad));
  EXPECT_EQ(bad.code(), dsa::ErrorCode::bad_shape);
  EXPECT_EQ(bad.message(), "topk: logits: must be 2-D");
  EXPECT_EQ(bad.to_string(), "bad_shape: topk: logits: must be 2-D");
}

TEST(Status, ErrorCodeNamesAreTheEnumeratorNames) {
  const std::pair<dsa::ErrorCode, const char*> names[] = {
      {dsa::ErrorCode::ok, "ok"},
      {dsa::ErrorCode::null_pointer, "null_pointer"},
      {dsa::ErrorCode::bad_shape, "bad_shape"},
      {dsa::ErrorCode::bad_dtype, "bad_dtype"},
      {dsa::ErrorCode::bad_stride, "bad_stride"},
      {dsa::ErrorCode::bad_alignment, "bad_alignment"},
      {dsa::ErrorCode::bad_device, "bad_device"},
      {dsa::ErrorCode::length_out_of_range, "length_out_of_range"},
      {dsa::ErrorCode::page_out_of_range, "page_out_of_range"},
      {dsa::ErrorCode::k_out_of_range, "k_out_of_range"},
      {dsa::ErrorCode::schedule_mismatch, "schedule_mismatch"},
      {dsa::ErrorCode::workspace_too_small, "workspace_too_small"},
      {dsa::ErrorCode::invalid_argument, "invalid_argument"},
      {dsa::ErrorCode::unsupported, "unsupported"},
      {dsa::ErrorCode::cuda_error, "cuda_error"},
      {dsa::ErrorCode::out_of_memory, "out_of_memory"},
      {dsa::ErrorCode::internal, "internal"},
  };
  for (const auto& [code, name] : names) EXPECT_STREQ(dsa::error_code_name(code), name);
}

dsa::Status fails_then_succeeds(bool fail) {
  DSA_RETURN_IF_ERROR(fail ? dsa::Status(dsa::ErrorCode::internal, "first") : dsa::Status());
  return dsa::Status(dsa::ErrorCode::unsupported, "second");
}

TEST(Status, ReturnIfErrorPropagatesOnlyFailures) {
  EXPECT_EQ(fails_then_succeeds(true).message(), "first");
  EXPECT_EQ(fails_then_succeeds(false).message(), "second");
}

TEST(TensorView, DtypeSizesAndNames) {
  EXPECT_EQ(dsa::dtype_size(dsa::DType::uint8), 1u);
  EXPECT_EQ(dsa::dtype_size(dsa::DType::int32), 4u);
  EXPECT_EQ(dsa::dtype_size(dsa::DType::int64), 8u);
  EXPECT_EQ(dsa::dtype_size(dsa::DType::float32), 4u);
  EXPECT_EQ(dsa::dtype_size(dsa::DType::bfloat16), 2u);
  EXPECT_EQ(dsa::dtype_size(dsa::DType::float8_e4m3), 1u);
  EXPECT_STREQ(dsa::dtype_name(dsa::DType::float32), "float32");
  EXPECT_STREQ(dsa::dtype_name(dsa::DType::float8_e4m3), "float8_e4m3");
  EXPECT_STREQ(dsa::dtype_name(dsa::DType::bfloat16), "bfloat16");
  EXPECT_STREQ(dsa::dtype_name(dsa::DType::int32), "int32");
}

TEST(TensorView, MakeViewGivesRowMajorStrides) {
  float storage[2 * 3 * 4];
  const dsa::TensorView v = dsa::make_view(storage, dsa::DType::float32, {2, 3, 4});
  EXPECT_EQ(v.data, storage);
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.size(0), 2);
  EXPECT_EQ(v.size(2), 4);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_FALSE(v.empty());
  EXPECT_EQ(v.device, dsa::Device{});
}

TEST(TensorView, ExplicitStridesAndContiguity) {
  float storage[64];
  const dsa::TensorView padded = dsa::make_view(storage, dsa::DType::float32, {4, 5}, {8, 1});
  EXPECT_EQ(padded.stride(0), 8);
  EXPECT_EQ(padded.numel(), 20);
  EXPECT_FALSE(padded.is_contiguous());
  EXPECT_TRUE(dsa::make_view(storage, dsa::DType::float32, {4, 5}, {5, 1}).is_contiguous());
  EXPECT_FALSE(dsa::make_view(storage, dsa::DType::float32, {4, 5}, {1, 4}).is_contiguous());
  EXPECT_EQ(dsa::make_view(storage, dsa::DType::float32, {4, 0}).numel(), 0);
  EXPECT_TRUE(dsa::TensorView{}.empty());
}

TEST(TensorView, DescribeNamesDtypeShapeStridesAndDevice) {
  float storage[4];
  const dsa::TensorView v =
      dsa::make_view(storage, dsa::DType::float32, {4, 128}, {256, 1}, dsa::Device{dsa::DeviceType::cuda, 0});
  EXPECT_EQ(v.describe(), "float32[4, 128] strides [256, 1] on cuda:0");
  const std::string host = dsa::make_view(storage, dsa::DType::int32, {2, 2}).describe();
  EXPECT_NE(host.find("int32[2, 2]"), std::string::npos) << host;
}

TEST(Names, BackendsAndPathsHaveDistinctNames) {
  std::set<std::string> names;
  for (const dsa::Backend b : {dsa::Backend::automatic, dsa::Backend::cpu_reference, dsa::Backend::cpu,
                               dsa::Backend::cuda_generic, dsa::Backend::cuda_hopper}) {
    ASSERT_NE(dsa::backend_name(b), nullptr);
    names.insert(dsa::backend_name(b));
  }
  EXPECT_EQ(names.size(), 5u);
  names.clear();
  for (const dsa::LogitsPath p : {dsa::LogitsPath::automatic, dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
    ASSERT_NE(dsa::logits_path_name(p), nullptr);
    names.insert(dsa::logits_path_name(p));
  }
  EXPECT_EQ(names.size(), 3u);
}

TEST(Device, WithoutCudaEverythingReportsNoDevice) {
  if (dsa::built_with_cuda() && dsa::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(dsa::cuda_device_count(), 0);
  dsa::DeviceInfo info;
  EXPECT_FALSE(dsa::get_device_info(0, &info).ok());
  dsa::DeviceBuffer buffer;
  const dsa::Status allocated = dsa::DeviceBuffer::allocate(1024, 0, &buffer);
  EXPECT_FALSE(allocated.ok());
  if (!dsa::built_with_cuda()) {
    EXPECT_EQ(allocated.code(), dsa::ErrorCode::unsupported);
  }
  EXPECT_EQ(buffer.data(), nullptr);
  dsa::DeviceStream stream;
  EXPECT_FALSE(dsa::DeviceStream::create(0, &stream).ok());
}

TEST(Device, ReadDeviceErrorIsOkForCpuContexts) {
  for (const dsa::Backend backend : cpu_backends()) EXPECT_TRUE(dsa::read_device_error(cpu_context(backend)).ok());
}

}  // namespace
}  // namespace dsa_test
