// dsa-indexer: index selection for DeepSeek Sparse Attention.
// Include this header for the whole public API.
#pragma once

#include "dsa/cache.hpp"
#include "dsa/context.hpp"
#include "dsa/device.hpp"
#include "dsa/index_topk.hpp"
#include "dsa/lengths.hpp"
#include "dsa/logits.hpp"
#include "dsa/prefill.hpp"
#include "dsa/query.hpp"
#include "dsa/schedule.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"
#include "dsa/topk.hpp"
