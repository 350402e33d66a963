// The CUDA side of a build without CUDA: no devices, every CUDA entry point
// answers `unsupported`, every workspace query 0.
#include "backend.hpp"
#include "dsa/device.hpp"

namespace dsa {

namespace {
Status no_cuda(const char* what) {
  return {ErrorCode::unsupported,
          std::string(what) + ": this build of dsa-indexer has no CUDA backends"};
}
}  // namespace

bool built_with_cuda() noexcept { return false; }
int cuda_device_count() noexcept { return 0; }
Status get_device_info(int, DeviceInfo*) { return no_cuda("get_device_info"); }

Status DeviceBuffer::allocate(std::size_t, int, DeviceBuffer*) { return no_cuda("DeviceBuffer::allocate"); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
DeviceBuffer::~DeviceBuffer() = default;
Status DeviceBuffer::copy_from_host(const void*, std::size_t, std::size_t) {
  return no_cuda("DeviceBuffer::copy_from_host");
}
Status DeviceBuffer::copy_to_host(void*, std::size_t, std::size_t) const {
  return no_cuda("DeviceBuffer::copy_to_host");
}
Status DeviceBuffer::fill_bytes(unsigned char) { return no_cuda("DeviceBuffer::fill_bytes"); }

Status DeviceStream::create(int, DeviceStream*) { return no_cuda("DeviceStream::create"); }
DeviceStream::DeviceStream(DeviceStream&&) noexcept {}
DeviceStream& DeviceStream::operator=(DeviceStream&&) noexcept { return *this; }
DeviceStream::~DeviceStream() = default;
Status DeviceStream::synchronize() const { return no_cuda("DeviceStream::synchronize"); }

namespace detail::cuda {

// No device to enter: the operation itself answers `unsupported`.
DeviceGuard::~DeviceGuard() = default;
Status OperationScope::enter(int, const ExecContext&, RecordClear) { return Status::success(); }

Status store_index_keys(const StoreKeysProblem&, const ExecContext&) { return no_cuda("store_index_keys"); }
Status quantize_queries(const QuantizeQueriesProblem&, const ExecContext&) { return no_cuda("quantize_queries"); }
Status context_lens(const LengthsProblem&, const ExecContext&) { return no_cuda("context_lens"); }
Status plan_schedule(const ScheduleProblem&, const ExecContext&) { return no_cuda("plan_schedule"); }
Status context_lens_and_schedule(const LengthsProblem&, const ScheduleProblem&, const ExecContext&) {
  return no_cuda("context_lens_and_schedule");
}
Status paged_mqa_logits(const LogitsProblem&, bool, const ExecContext&) { return no_cuda("paged_mqa_logits"); }
Status mqa_logits(const MqaLogitsProblem&, bool, const ExecContext&) { return no_cuda("mqa_logits"); }
Status topk(const TopkProblem&, const ExecContext&) { return no_cuda("topk"); }
Status index_topk(const IndexTopkProblem&, bool, const ExecContext&) { return no_cuda("index_topk"); }

std::size_t workspace_bytes_basic() { return 0; }
std::size_t topk_workspace_bytes() { return 0; }
std::size_t index_topk_workspace_bytes(std::int64_t, std::int64_t, bool, int, int) { return 0; }

bool hopper_available(int) { return false; }
bool hopper_supports_native(int, int, int) { return false; }
bool hopper_supports_mqa_logits(const MqaLogitsProblem&) { return false; }
int multiprocessor_count(int) { return 0; }
Status read_device_error(const ExecContext&, const char* operation) { return no_cuda(operation); }

}  // namespace detail::cuda
}  // namespace dsa
