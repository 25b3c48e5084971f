// dynemb torch layer: the embedding ops, written once over a Backend (see
// table_op_impls.h for the pattern). The Backend adds:
//
//   template <class V> static void pool(std::vector<PoolPart<V>>&, PartTotals, PoolingMode,
//                                       like);  // every part's bags (core/grouped.h)
//   template <class V> static void gather(TableRef<V>, slots*, keys*, n, InitArgs, float*, dim);
//   static void dedup(std::vector<DedupPart>&, PartTotals, unique&, inverse&, counts&,
//                     num_unique&);  // flat (total) tensors; U per part, on the device
//   static std::vector<int64_t> sizes_to_host(sizes);  // the host's copy (a wait on a GPU)
//   template <class V> static void backward(std::vector<BackwardPart<V>>&, PartTotals,
//                                           PoolingMode, OptimizerArgs, like);
//   template <class V> static void cache_exchange(TableRef<V> cache, TableRef<V> slow,
//                                                 CacheExchange<V>);
//   static CacheMoves cache_moves(status, slots);  // the keys moves_in picks, compact
//
// A per-table op is a call with one part; a *_grouped op takes every table of a batch
// (the module's tables, one call per phase) with the same per-table checks.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/grouped.h"
#include "core/optimizer_rules.h"
#include "core/pooling.h"
#include "torch/cache_op_impls.h"
#include "torch/embedding_op_checks.h"
#include "torch/op_lists.h"
#include "torch/op_scope.h"
#include "torch/table_op_impls.h"

namespace dynemb {

template <class Backend>
struct EmbeddingOpImpls {
  template <class TorchV>
  using V = typename Backend::template Value<TorchV>;

  static at::Tensor pool(at::TensorList table_list, const at::Tensor& slots, const at::Tensor& keys,
                         const at::Tensor& offsets, const std::optional<at::Tensor>& weights,
                         int64_t mode, at::ArrayRef<double> missing, int64_t seed, int64_t dim) {
    constexpr const char* op = "embedding_pool";
    const PoolArgs args =
        check_pool(op, table_list, slots, keys, offsets, weights, missing, seed, dim);
    const PoolingMode pooling = parse_pooling(op, mode);
    at::Tensor out = at::empty({args.num_bags, dim}, slots.options().dtype(at::kFloat));
    run_pool(op, {args}, {dense_bags(out.data_ptr<float>(), dim)}, pooling);
    return out;
  }

  /// embedding_pool writing bag b to out's row b % B, columns columns[b / B] ..
  /// + dim (B = out.size(0)): a table's features straight into a module's output.
  static void pool_into(at::TensorList table_list, const at::Tensor& slots,
                        const at::Tensor& keys, const at::Tensor& offsets,
                        const std::optional<at::Tensor>& weights, int64_t mode,
                        at::ArrayRef<double> missing, int64_t seed, int64_t dim,
                        const at::Tensor& out, const at::Tensor& columns) {
    constexpr const char* op = "embedding_pool_into";
    const PoolArgs args =
        check_pool(op, table_list, slots, keys, offsets, weights, missing, seed, dim);
    const PoolingMode pooling = parse_pooling(op, mode);
    check_bag_columns(op, "out", out, columns, args.num_bags, dim, args.table.digests);
    run_pool(op, {args}, {bag_columns(out.data_ptr<float>(), out, columns)}, pooling);
  }

  /// embedding_pool_into of every table of a batch in one executor call: table t is
  /// tables[t * kTableTensors ..) with slots[t], keys[t], offsets[t], weights[t] (weights:
  /// none or one per table), missing[t * kInitSize ..), seeds[t], dims[t], columns[t]. inverse:
  /// empty (slots[t] has a slot per index), or one per table: slots[t] then has a slot
  /// per distinct key (the lookup's unique_slots) and index i's is slots[t][inverse[t][i]].
  static void pool_into_grouped(at::TensorList tables, at::TensorList slots,
                                at::TensorList inverse, at::TensorList keys,
                                at::TensorList offsets,
                                at::TensorList weights, int64_t mode,
                                at::ArrayRef<double> missing, at::IntArrayRef seeds,
                                at::IntArrayRef dims, const at::Tensor& out,
                                at::TensorList columns) {
    constexpr const char* op = "embedding_pool_into_grouped";
    const size_t n = slots.size();
    check_grouped_lists(op, tables, n, weights.size());
    TORCH_CHECK_VALUE(inverse.empty() || inverse.size() == n, "dynemb.", op,
                      ": `inverse` must hold no tensor or one per table (", n, "), got ",
                      inverse.size());
    check_list_size(op, "keys", keys.size(), n, n);
    check_list_size(op, "offsets", offsets.size(), n, n);
    check_list_size(op, "missing", missing.size(), n * kInitSize, n);
    check_list_size(op, "seeds", seeds.size(), n, n);
    check_list_size(op, "dims", dims.size(), n, n);
    check_list_size(op, "columns", columns.size(), n, n);
    const PoolingMode pooling = parse_pooling(op, mode);
    std::vector<PoolArgs> args;
    std::vector<BagRows<float>> outs;
    args.reserve(n);
    for (size_t t = 0; t < n; ++t) {
      const std::string name = table_op_name(op, t);
      const std::optional<at::Tensor> w =
          weights.empty() ? std::nullopt : std::optional<at::Tensor>(weights[t]);
      args.push_back(check_pool(name.c_str(), tables.slice(t * kTableTensors, kTableTensors),
                                slots[t], keys[t], offsets[t], w,
                                missing.slice(t * kInitSize, kInitSize), seeds[t], dims[t],
                                inverse.empty() ? nullptr : &inverse[t]));
      check_bag_columns(name.c_str(), "out", out, columns[t], args[t].num_bags, dims[t],
                        args[t].table.digests);
      outs.push_back(bag_columns(out.data_ptr<float>(), out, columns[t]));
    }
    run_pool(op, args, outs, pooling);
  }

  static at::Tensor gather(at::TensorList table_list, const at::Tensor& slots, const at::Tensor& keys,
                           at::ArrayRef<double> missing, int64_t seed, int64_t dim) {
    constexpr const char* op = "embedding_gather";
    const TableTensors table = checked_table(op, table_list);
    check_slot_list(op, "slots", slots, table.digests, -1);
    check_tensor(op, "keys", keys, at::kLong, 1);
    check_same_device(op, "keys", keys, table.digests);
    TORCH_CHECK_VALUE(keys.numel() == slots.numel(), "dynemb.", op, ": `keys` has ", keys.numel(),
                      " elements, `slots` has ", slots.numel());
    check_dim(op, table, dim);
    const InitArgs init = parse_missing(op, missing, seed);
    typename Backend::DeviceGuard guard(table.digests.device());
    at::Tensor out = at::empty({slots.numel(), dim}, slots.options().dtype(at::kFloat));
    dispatch_values(op, table.values, [&](auto v) {
      using W = V<decltype(v)>;
      Backend::gather(table_ref<W>(table), slots.data_ptr<int64_t>(), keys.data_ptr<int64_t>(),
                      slots.numel(), init, out.data_ptr<float>(), dim);
    });
    return out;
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_keys(const at::Tensor& keys) {
    auto [unique, inverse, counts] = run_dedup("unique_keys", {keys});
    return {unique[0], inverse[0], counts[0]};
  }

  /// unique_keys of each tensor of `keys` (each table's keys of a batch) in one call:
  /// the lists (unique, inverse, counts) hold one result per tensor. (An empty list
  /// cannot reach here: the dispatcher finds no device in it.)
  static std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>>
  unique_keys_grouped(at::TensorList keys) {
    return run_dedup("unique_keys_grouped", keys);
  }

  /// unique_keys_grouped without a read of the counts: unique[t] and counts[t] have
  /// keys[t]'s length and hold the result in their first num_unique[t] entries;
  /// num_unique (T) int64 stays on the keys' device (a padded batch, read later with
  /// what else the host needs then).
  static std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                    at::Tensor>
  unique_keys_grouped_padded(at::TensorList keys) {
    Dedup d = dedup_parts("unique_keys_grouped_padded", keys);
    std::vector<at::Tensor> u, i, c;
    for (const DedupPart& part : d.parts) {
      u.push_back(d.unique.narrow(0, part.index_begin, part.n));
      i.push_back(d.inverse.narrow(0, part.index_begin, part.n));
      c.push_back(d.counts.narrow(0, part.index_begin, part.n));
    }
    return {u, i, c, d.num_unique};
  }

  static void backward(at::TensorList table_list, const at::Tensor& unique_slots,
                       const at::Tensor& inverse, const at::Tensor& offsets,
                       const std::optional<at::Tensor>& weights, int64_t mode,
                       const at::Tensor& grad, at::ArrayRef<double> optimizer, int64_t step,
                       int64_t dim, const std::optional<at::Tensor>& columns) {
    constexpr const char* op = "embedding_backward";
    const PoolingMode pooling = parse_pooling(op, mode);
    const OptimizerArgs opt = parse_optimizer(op, optimizer, step);
    const BackwardArgs args = check_backward(op, table_list, unique_slots, inverse, offsets,
                                             weights, grad, columns, opt, dim);
    run_backward(op, {args}, pooling, opt);
  }

  /// embedding_backward of every table of a batch in one executor call (the tables
  /// must be distinct): table t is tables[9t .. 9t + 9) with unique_slots[t],
  /// inverse[t], offsets[t], weights[t] (none or one per table), dims[t], and its
  /// bags' gradients in grad's columns[t].
  static void backward_grouped(at::TensorList tables, at::TensorList unique_slots,
                               at::TensorList inverse, at::TensorList offsets,
                               at::TensorList weights, int64_t mode, const at::Tensor& grad,
                               at::ArrayRef<double> optimizer, int64_t step,
                               at::IntArrayRef dims, at::TensorList columns) {
    constexpr const char* op = "embedding_backward_grouped";
    const size_t n = unique_slots.size();
    check_grouped_lists(op, tables, n, weights.size());
    check_list_size(op, "inverse", inverse.size(), n, n);
    check_list_size(op, "offsets", offsets.size(), n, n);
    check_list_size(op, "dims", dims.size(), n, n);
    check_list_size(op, "columns", columns.size(), n, n);
    const PoolingMode pooling = parse_pooling(op, mode);
    const OptimizerArgs opt = parse_optimizer(op, optimizer, step);
    std::vector<BackwardArgs> args;
    args.reserve(n);
    for (size_t t = 0; t < n; ++t) {
      const std::string name = table_op_name(op, t);
      const std::optional<at::Tensor> w =
          weights.empty() ? std::nullopt : std::optional<at::Tensor>(weights[t]);
      args.push_back(check_backward(name.c_str(), tables.slice(t * kTableTensors, kTableTensors),
                                    unique_slots[t], inverse[t], offsets[t], w, grad,
                                    columns[t], opt, dims[t]));
      for (size_t s = 0; s < t; ++s) {  // their updates run at once: one table, one part
        TORCH_CHECK_VALUE(!args[s].table.values.is_same(args[t].table.values), "dynemb.", op,
                          ": tables ", s, " and ", t, " are the same table");
      }
    }
    run_backward(op, args, pooling, opt);
  }

 private:
  /// The dedup of every tensor of `keys` into flat buffers, a range per part (the
  /// parts' results are views of their ranges); num_unique (T) on the keys' device.
  struct Dedup {
    std::vector<DedupPart> parts;
    at::Tensor unique, inverse, counts, num_unique;
  };

  static Dedup dedup_parts(const char* op, at::TensorList keys) {
    const bool grouped = keys.size() > 1;
    Dedup d;
    for (size_t t = 0; t < keys.size(); ++t) {
      const std::string name = grouped ? table_op_name(op, t) : std::string(op);
      check_keys(name.c_str(), keys[t]);
      check_same_device(name.c_str(), "keys", keys[t], keys[0]);
      d.parts.push_back(DedupPart{keys[t].data_ptr<int64_t>(), keys[t].numel(), 0, 0});
    }
    const PartTotals totals = number_parts(d.parts.data(), static_cast<int64_t>(d.parts.size()));
    typename Backend::DeviceGuard guard(keys[0].device());
    d.unique = at::empty({totals.indices}, keys[0].options());
    d.inverse = at::empty({totals.indices}, keys[0].options());
    d.counts = at::empty({totals.indices}, keys[0].options());
    d.num_unique = at::empty({static_cast<int64_t>(d.parts.size())}, keys[0].options());
    Backend::dedup(d.parts, totals, d.unique, d.inverse, d.counts, d.num_unique);
    return d;
  }

  static std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>>
  run_dedup(const char* op, at::TensorList keys) {
    Dedup d = dedup_parts(op, keys);
    const std::vector<int64_t> num_unique = Backend::sizes_to_host(d.num_unique);
    std::vector<at::Tensor> u, i, c;
    for (size_t t = 0; t < d.parts.size(); ++t) {
      const int64_t at = d.parts[t].index_begin;
      u.push_back(d.unique.narrow(0, at, num_unique[t]));
      i.push_back(d.inverse.narrow(0, at, d.parts[t].n));
      c.push_back(d.counts.narrow(0, at, num_unique[t]));
    }
    return {u, i, c};
  }

  /// A grouped op's `tables` (kTableTensors per table) and `weights` (none or one per
  /// table) for n >= 1 tables.
  static void check_grouped_lists(const char* op, at::TensorList tables, size_t n,
                                  size_t num_weights) {
    TORCH_CHECK_VALUE(n >= 1, "dynemb.", op, ": needs at least one table, got none");
    check_list_size(op, "tables", tables.size(), n * kTableTensors, n);
    TORCH_CHECK_VALUE(num_weights == 0 || num_weights == n, "dynemb.", op,
                      ": `weights` must hold no tensor or one per table (", n, "), got ",
                      num_weights);
  }

  /// The tables of one call share a value dtype (one executor instantiation).
  template <class Args>
  static void check_same_values(const char* op, const std::vector<Args>& args) {
    for (size_t t = 1; t < args.size(); ++t) {
      TORCH_CHECK_TYPE(args[t].table.values.scalar_type() == args[0].table.values.scalar_type(),
                       "dynemb.", op, ": every table must have the value dtype of table 0 (",
                       args[0].table.values.scalar_type(), "), table ", t, " has ",
                       args[t].table.values.scalar_type());
    }
  }

  /// inverse: null, or (n) ids into `slots` (then a slot per distinct key).
  static PoolArgs check_pool(const char* op, at::TensorList table_list, const at::Tensor& slots,
                             const at::Tensor& keys, const at::Tensor& offsets,
                             const std::optional<at::Tensor>& weights,
                             at::ArrayRef<double> missing, int64_t seed, int64_t dim,
                             const at::Tensor* inverse = nullptr) {
    const TableTensors table = checked_table(op, table_list);
    if (inverse == nullptr) {
      check_bags(op, table.digests, "slots", slots, &keys, offsets, weights);
      check_range(op, "slots", "slots", slots, -1, table.digests.numel());
    } else {
      check_slot_list(op, "slots", slots, table.digests, -1);
      check_bags(op, table.digests, "inverse", *inverse, &keys, offsets, weights);
      check_range(op, "inverse", "ids", *inverse, 0, slots.numel());
    }
    check_dim(op, table, dim);
    return PoolArgs{table,   slots,   inverse,
                    keys,    offsets,
                    opt_ptr(weights), parse_missing(op, missing, seed),
                    offsets.numel() - 1, dim};
  }

  static void run_pool(const char* op, const std::vector<PoolArgs>& args,
                       const std::vector<BagRows<float>>& outs, PoolingMode pooling) {
    check_same_values(op, args);
    const TableTensors& first = args[0].table;
    typename Backend::DeviceGuard guard(first.digests.device());
    dispatch_values(op, first.values, [&](auto v) {
      using W = V<decltype(v)>;
      std::vector<PoolPart<W>> parts;
      parts.reserve(args.size());
      for (size_t t = 0; t < args.size(); ++t) {
        const PoolArgs& a = args[t];
        const IndexSlots slots{a.slots.data_ptr<int64_t>(),
                               a.inverse ? a.inverse->data_ptr<int64_t>() : nullptr};
        parts.push_back(PoolPart<W>{table_ref<W>(a.table), slots, a.keys.data_ptr<int64_t>(),
                                    a.offsets.data_ptr<int64_t>(), a.weights, a.missing,
                                    outs[t], a.num_bags, a.dim, 0});
      }
      const PartTotals totals = number_parts(parts.data(), static_cast<int64_t>(parts.size()));
      Backend::pool(parts, totals, pooling, first.keys.options());
    });
  }

  static BackwardArgs check_backward(const char* op, at::TensorList table_list,
                                     const at::Tensor& unique_slots, const at::Tensor& inverse,
                                     const at::Tensor& offsets,
                                     const std::optional<at::Tensor>& weights,
                                     const at::Tensor& grad,
                                     const std::optional<at::Tensor>& columns,
                                     const OptimizerArgs& opt, int64_t dim) {
    const TableTensors table = checked_table(op, table_list);
    check_slot_list(op, "unique_slots", unique_slots, table.digests, -1);
    check_bags(op, table.digests, "inverse", inverse, nullptr, offsets, weights);
    check_range(op, "inverse", "ids", inverse, 0, unique_slots.numel());
    check_dim(op, table, dim);
    const int64_t num_bags = offsets.numel() - 1;
    if (columns.has_value()) {  // bag b's gradient: row b % B, columns[b / B] of grad
      check_bag_columns(op, "grad", grad, *columns, num_bags, dim, table.digests);
    } else {
      check_tensor(op, "grad", grad, at::kFloat, 2);
      check_same_device(op, "grad", grad, table.digests);
      TORCH_CHECK_VALUE(grad.size(0) == num_bags && grad.size(1) == dim, "dynemb.", op,
                        ": `grad` must have shape (", num_bags, ", ", dim, "), got ",
                        grad.sizes());
    }
    TORCH_CHECK_VALUE(dim + state_columns(opt.kind, dim) <= table.values.size(1), "dynemb.", op,
                      ": the table's rows (", table.values.size(1),
                      " columns) cannot hold this optimizer's state for dim ", dim);
    const float* g = grad.data_ptr<float>();
    const BagRows<const float> grad_rows =
        columns.has_value() ? bag_columns(g, grad, *columns) : dense_bags(g, dim);
    return BackwardArgs{table,    unique_slots, inverse,  offsets,
                        opt_ptr(weights), grad_rows, num_bags, dim};
  }

  static void run_backward(const char* op, const std::vector<BackwardArgs>& args,
                           PoolingMode pooling, const OptimizerArgs& opt) {
    check_same_values(op, args);
    const TableTensors& first = args[0].table;
    typename Backend::DeviceGuard guard(first.digests.device());
    dispatch_values(op, first.values, [&](auto v) {
      using W = V<decltype(v)>;
      std::vector<BackwardPart<W>> parts;
      parts.reserve(args.size());
      for (const BackwardArgs& a : args) {
        parts.push_back(BackwardPart<W>{
            table_ref<W>(a.table), a.unique_slots.data_ptr<int64_t>(),
            a.inverse.data_ptr<int64_t>(), a.offsets.data_ptr<int64_t>(), a.weights, a.grad,
            a.num_bags, a.inverse.numel(), a.unique_slots.numel(), a.dim, 0, 0, 0, 0});
      }
      const PartTotals totals = number_parts(parts.data(), static_cast<int64_t>(parts.size()));
      Backend::backward(parts, totals, pooling, opt, first.keys.options());
    });
  }

  static const float* opt_ptr(const std::optional<at::Tensor>& t) {
    return t.has_value() ? t->data_ptr<float>() : nullptr;
  }
  /// The op argument `optimizer` (op_lists.h op_list::Optimizer) with `step`.
  static OptimizerArgs parse_optimizer(const char* op, at::ArrayRef<double> o, int64_t step) {
    namespace L = op_list;
    TORCH_CHECK_VALUE(o.size() == L::kOptimizerSize || o.size() == L::kOptimizerSizeNoFtrl ||
                          o.size() == L::kOptimizerSizeNoRounding,
                      "dynemb.", op, ": `optimizer` must be ",
                      L::names_of(L::kOptimizerFieldNames), ", got ", o.size(), " values");
    const auto kind = static_cast<int64_t>(o[L::kKind]);
    TORCH_CHECK_VALUE(kind >= 0 && kind < kOptimizerKindCount, "dynemb.", op,
                      ": unknown optimizer kind ", kind);
    const bool ftrl = static_cast<OptimizerKind>(kind) == OptimizerKind::kFtrl;
    TORCH_CHECK_VALUE(!ftrl || o.size() > L::kL2Reg, "dynemb.", op,
                      ": FTRL's `optimizer` must be ", L::names_of(L::kOptimizerFieldNames),
                      " (with its fields), got ", o.size(), " values");
    auto field = [&](size_t i) { return i < o.size() ? static_cast<float>(o[i]) : 0.0f; };
    const double rounding = o.size() > L::kStochasticRounding ? o[L::kStochasticRounding] : 0.0;
    const double seed = o.size() > L::kRoundingSeed ? o[L::kRoundingSeed] : 0.0;
    TORCH_CHECK_VALUE(rounding == 0.0 || rounding == 1.0, "dynemb.", op,
                      ": `optimizer`'s stochastic_rounding must be 0 or 1, got ", rounding);
    TORCH_CHECK_VALUE(seed >= 0 && seed < 9007199254740992.0 &&
                          seed == static_cast<double>(static_cast<int64_t>(seed)),
                      "dynemb.", op, ": `optimizer`'s rounding_seed must be a whole number in ",
                      "[0, 2^53), got ", seed);
    TORCH_CHECK_VALUE(step >= 1, "dynemb.", op, ": `step` must be >= 1, got ", step);
    return OptimizerArgs{static_cast<OptimizerKind>(kind),
                         static_cast<float>(o[L::kLearningRate]),
                         static_cast<float>(o[L::kEps]),
                         static_cast<float>(o[L::kBeta1]),
                         static_cast<float>(o[L::kBeta2]),
                         static_cast<float>(o[L::kWeightDecay]),
                         field(L::kLearningRatePower),
                         field(L::kFtrlBeta),
                         field(L::kL1Reg),
                         field(L::kL2Reg),
                         step,
                         rounding == 1.0,
                         static_cast<uint64_t>(seed)};
  }
};

#define DYNEMB_REGISTER_EMBEDDING_OPS(m, Backend)                                 \
  do {                                                                            \
    using EImpl = ::dynemb::EmbeddingOpImpls<Backend>;                            \
    DYNEMB_IMPL(m, "embedding_pool", &EImpl::pool);                                     \
    DYNEMB_IMPL(m, "embedding_pool_into", &EImpl::pool_into);                           \
    DYNEMB_IMPL(m, "embedding_pool_into_grouped", &EImpl::pool_into_grouped);           \
    DYNEMB_IMPL(m, "embedding_gather", &EImpl::gather);                                 \
    DYNEMB_IMPL(m, "embedding_backward", &EImpl::backward);                             \
    DYNEMB_IMPL(m, "embedding_backward_grouped", &EImpl::backward_grouped);             \
    DYNEMB_IMPL(m, "unique_keys", &EImpl::unique_keys);                                 \
    DYNEMB_IMPL(m, "unique_keys_grouped", &EImpl::unique_keys_grouped);                 \
    DYNEMB_IMPL(m, "unique_keys_grouped_padded", &EImpl::unique_keys_grouped_padded);   \
    DYNEMB_IMPL(m, "table_cache_exchange", &::dynemb::CacheOpImpls<Backend>::cache_exchange); \
  } while (0)

}  // namespace dynemb
