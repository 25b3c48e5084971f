// dynemb CUDA executor: key hashing (core/hash.h) and score updates (core/score_policy.h), one thread per key.
#include "cuda/kernel_common.cuh"
#include "cuda/launchers_cuda.h"

namespace dynemb::DYNEMB_CUDA_NS {
namespace {

__global__ void hash_keys_kernel(const int64_t* keys, int64_t n, int64_t num_buckets,
                                 int64_t* bucket, uint8_t* digest) {
  const int64_t i = thread_index();
  if (i >= n) return;
  const uint64_t h = hash_key(keys[i]);
  bucket[i] = bucket_of(h, num_buckets);
  digest[i] = digest_of(h);
}

__global__ void scores_after_hit_kernel(ScoreArgs args, const uint64_t* scores, int64_t n,
                                        uint64_t* out) {
  const int64_t i = thread_index();
  if (i < n) out[i] = score_after_tier_hit(args, i, scores[i]);
}

}  // namespace

void launch_scores_after_hit(const ScoreArgs& args, const uint64_t* scores, int64_t n,
                             uint64_t* out, cudaStream_t stream) {
  if (n == 0) return;
  DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, scores_after_hit_kernel)(args, scores, n, out);
}

void launch_hash_keys(const int64_t* keys, int64_t n, int64_t num_buckets, int64_t* bucket,
                      uint8_t* digest, cudaStream_t stream) {
  if (n == 0) return;
  DYNEMB_LAUNCH(blocks_for(n), kBlock, stream, hash_keys_kernel)(keys, n, num_buckets, bucket,
                                                                 digest);
}

}  // namespace dynemb::DYNEMB_CUDA_NS
