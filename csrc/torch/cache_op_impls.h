// dynemb torch layer: the cache tier's row exchange op (table_cache_exchange), written
// once over a Backend like the embedding ops (embedding_op_impls.h): the Backend adds
//
//   template <class V> static void cache_exchange(TableRef<V> cache, TableRef<V> slow,
//                                                 CacheExchange<V>);
//   static CacheMoves cache_moves(status, slots, moved, victims);  // the keys moves_in
//       picks, compact; moved, victims >= 0: the caller's counts (a backend may trust
//       them rather than read the device)
#pragma once

#include <tuple>

#include "core/tier_ops.h"
#include "torch/embedding_op_checks.h"

namespace dynemb {

template <class Backend>
struct CacheOpImpls {
  template <class TorchV>
  using V = typename Backend::template Value<TorchV>;

  /// A cache fill's row moves (core/tier_ops.h fetch_entry). Returns (victim_keys (v),
  /// victim_rows (v, row_width), victim_scores (v) or (v, 2), found (n)), the victims in
  /// key order; fills the cache rows and user_scores at `slots`. user_scores is (cache
  /// slots), or (cache slots, 2) of (score, timestamp) where `slow` keeps timestamps.
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cache_exchange(
      at::TensorList cache_list, at::TensorList slow_list, at::ArrayRef<double> init, int64_t seed,
      int64_t dim, const at::Tensor& user_scores, const at::Tensor& keys,
      const at::Tensor& slots, const at::Tensor& status, const at::Tensor& evicted_keys,
      int64_t moved_count, int64_t victim_count) {
    constexpr const char* op = "table_cache_exchange";
    const TableTensors cache = checked_table(op, cache_list);
    const TableTensors slow = checked_table(op, slow_list);
    check_same_device(op, "slow", slow.digests, cache.digests);
    TORCH_CHECK_VALUE(cache.values.scalar_type() == slow.values.scalar_type() &&
                          cache.values.size(1) == slow.values.size(1),
                      "dynemb.", op, ": `cache` and `slow` must have the same row layout, got ",
                      cache.values.scalar_type(), " x ", cache.values.size(1), " and ",
                      slow.values.scalar_type(), " x ", slow.values.size(1));
    check_dim(op, cache, dim);
    const InitArgs init_args = parse_missing(op, init, seed);
    const int64_t num_slots = cache.digests.numel(), n = keys.numel();
    // One score column a slot, or (score, last-access time) where `slow` keeps
    // timestamps (the compounds): a timestamp is never dropped nor invented.
    const int64_t columns = slow.timestamps.numel() ? 2 : 1;
    TORCH_CHECK_VALUE(user_scores.scalar_type() == at::kLong && user_scores.is_contiguous() &&
                          user_scores.dim() == columns && user_scores.size(0) == num_slots &&
                          (columns == 1 || user_scores.size(1) == columns),
                      "dynemb.", op, ": `user_scores` must be a contiguous int64 tensor of shape (",
                      num_slots, columns == 1 ? ")" : ", 2) (score, timestamp: `slow` keeps "
                      "timestamps)", ", one entry per cache slot, got ", user_scores.scalar_type(),
                      " of shape ", user_scores.sizes(),
                      user_scores.is_contiguous() ? "" : " (not contiguous)");
    check_same_device(op, "user_scores", user_scores, cache.digests);
    check_keys(op, keys);
    check_same_device(op, "keys", keys, cache.digests);
    check_slot_list(op, "slots", slots, cache.digests, -1);
    check_tensor(op, "status", status, at::kChar, 1);
    check_tensor(op, "evicted_keys", evicted_keys, at::kLong, 1);
    for (const at::Tensor* t : {&slots, &status, &evicted_keys}) {
      TORCH_CHECK_VALUE(t->numel() == n, "dynemb.", op,
                        ": `slots`, `status` and `evicted_keys` need one element per key (", n,
                        "), got ", t->numel());
    }
    check_same_device(op, "status", status, cache.digests);
    check_same_device(op, "evicted_keys", evicted_keys, cache.digests);
    const bool given = moved_count >= 0 || victim_count >= 0;
    TORCH_CHECK_VALUE(!given || (moved_count >= 0 && moved_count <= n && victim_count >= 0 &&
                                 victim_count <= moved_count),
                      "dynemb.", op, ": `moved` and `victims` must both be -1, or counts with ",
                      "0 <= victims <= moved <= ", n, " (the keys), got moved=", moved_count,
                      " and victims=", victim_count);
    typename Backend::DeviceGuard guard(cache.digests.device());
    // Victims are compact, in key order.
    const CacheMoves moves = Backend::cache_moves(status, slots, moved_count, victim_count);
    TORCH_CHECK_VALUE(moves.without_slot == 0, "dynemb.", op, ": ", moves.without_slot,
                      " keys whose `status` moves them in have slot -1");
    TORCH_CHECK_VALUE(!given || !moves.counted || (moves.moved.numel() == moved_count &&
                                                   moves.victims == victim_count),
                      "dynemb.", op, ": `moved`=", moved_count, " and `victims`=", victim_count,
                      " must be the counts of `status`: ", moves.moved.numel(), " keys move in, ",
                      moves.victims, " of them evicting a resident");
    const int64_t m = moves.moved.numel(), nv = moves.victims;
    at::Tensor victim_keys = at::empty({nv}, keys.options());
    at::Tensor victim_rows = at::empty({nv, cache.values.size(1)}, cache.values.options());
    at::Tensor victim_scores =
        columns == 1 ? at::empty({nv}, keys.options()) : at::empty({nv, columns}, keys.options());
    at::Tensor found = at::zeros(keys.sizes(), keys.options().dtype(at::kBool));
    dispatch_values(op, cache.values, [&](auto v) {
      using W = V<decltype(v)>;
      CacheExchange<W> x{init_args,
                         dim,
                         user_scores.data_ptr<int64_t>(),
                         keys.data_ptr<int64_t>(),
                         slots.data_ptr<int64_t>(),
                         evicted_keys.data_ptr<int64_t>(),
                         moves.moved.data_ptr<int64_t>(),
                         moves.victim_index.data_ptr<int64_t>(),
                         m,
                         found.data_ptr<bool>(),
                         victim_keys.data_ptr<int64_t>(),
                         reinterpret_cast<W*>(victim_rows.data_ptr()),
                         victim_scores.data_ptr<int64_t>(),
                         columns};
      if (!moves.counted) {
        x.device_counts = moves.device_counts.data_ptr<int64_t>();
        x.victim_capacity = nv;
      }
      Backend::cache_exchange(table_ref<W>(cache), table_ref<W>(slow), x);
    });
    return {victim_keys, victim_rows, victim_scores, found};
  }
};

}  // namespace dynemb
