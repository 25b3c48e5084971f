// dynemb core: key -> (bucket, digest).
//
// A key is mixed with the murmur3 64-bit finaliser (a bijection of uint64, so
// distinct keys never share a hash), then split into three independent fields:
//
//   bits 32..63  bucket: multiply-shift range reduction, which works for any bucket
//                count and maps bucket b of a table to buckets {2b, 2b+1} of a table
//                twice as large;
//   bits  8..31  home group: where the key's scan of its bucket starts (bucket.h);
//                independent of the bucket count, so a rehash keeps it;
//   bits  0..7   digest stored per slot; digest 0 marks an empty slot, so a key
//                whose low byte is 0 gets digest 1.
// A NO_EVICTION key may also live in a second bucket (second_bucket_of), drawn from
// a second mix of the hash.
//
// No key value is reserved: every int64 is a legal key, emptiness lives in the
// digest byte.
#pragma once

#include "core/macros.h"

namespace dynemb {

constexpr uint8_t kEmptyDigest = 0;

/// murmur3 fmix64: a bijective 64-bit mix.
DYNEMB_HD DYNEMB_INLINE uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

/// @param key any int64 (reinterpreted as uint64, two's complement)
/// @return the 64-bit hash of key
DYNEMB_HD DYNEMB_INLINE uint64_t hash_key(int64_t key) {
  return mix64(static_cast<uint64_t>(key));
}

/// @param hash hash_key(key)
/// @param num_buckets number of buckets, 1 <= num_buckets <= 2^32
/// @return the bucket index in [0, num_buckets)
DYNEMB_HD DYNEMB_INLINE int64_t bucket_of(uint64_t hash, int64_t num_buckets) {
  return static_cast<int64_t>(((hash >> 32) * static_cast<uint64_t>(num_buckets)) >> 32);
}

/// Buckets past its home among which a NO_EVICTION key's second bucket lies.
constexpr int64_t kSecondBucketSpan = 16;

/// @param hash hash_key(key)
/// @param num_buckets number of buckets, 2 <= num_buckets <= 2^32
/// @return the key's second bucket, one of the kSecondBucketSpan buckets after its home
///   (modulo num_buckets; never its home): drawn from a second mix of the hash, since
///   bucket, home group and digest take all 64 bits of the first. Near its home, so
///   that a growth in chunks knows where a chunk's keys may land.
DYNEMB_HD DYNEMB_INLINE int64_t second_bucket_of(uint64_t hash, int64_t num_buckets) {
  const uint64_t h2 = mix64(hash ^ 0x9E3779B97F4A7C15ULL) >> 32;
  const int64_t span = num_buckets - 1 < kSecondBucketSpan ? num_buckets - 1 : kSecondBucketSpan;
  const int64_t b = bucket_of(hash, num_buckets) + 1 + static_cast<int64_t>((h2 * span) >> 32);
  return b >= num_buckets ? b - num_buckets : b;
}

/// @param hash hash_key(key)
/// @param groups digest groups per bucket (bucket_capacity / 16), 1 <= groups <= 2^24
/// @return the key's home group in [0, groups)
DYNEMB_HD DYNEMB_INLINE int64_t home_group_of(uint64_t hash, int64_t groups) {
  return static_cast<int64_t>((((hash >> 8) & 0xFFFFFFu) * static_cast<uint64_t>(groups)) >> 24);
}

/// @param hash hash_key(key)
/// @return the slot digest in [1, 255] (0 is kEmptyDigest)
DYNEMB_HD DYNEMB_INLINE uint8_t digest_of(uint64_t hash) {
  const uint8_t d = static_cast<uint8_t>(hash);
  return d == kEmptyDigest ? uint8_t{1} : d;
}

}  // namespace dynemb
