// ThreadSanitizer cases of the emulated CUDA executor's pooling and backward
// (tsan_tables.cpp).
#include <cmath>
#include <cstring>

#include "tsan_common.h"

namespace dynemb::tsan {

/// The missing-row initializer of the pooling and its rows (core/pooling.h).
InitArgs missing_init() { return InitArgs{InitMode::kUniform, -0.5f, 0.5f, 0, 0, 0, 7}; }

/// Readers pool under the shared lock while a writer re-assigns rows under the exclusive
/// one (rw_lock.py's rule): every host thread pools its own bags of two tables in one
/// launch_pool per round, SUM and MEAN, with per-sample weights, empty bags and keys that
/// are not stored (the `missing` initializer's row). Part 0 reads a slot per index into
/// a dense (bags, 4) output; part 1 (dim 8, rows of 9 columns) reads slots per distinct
/// key through `inverse` into the columns of a feature-major (32, 16) output. Each
/// pooled bag equals the sum computed here from the rows the keys were given.
void emulated_pool() {
  Table narrow(16, 32, false), wide(16, 32, false, 9);
  constexpr int64_t kStored = 300;
  const int64_t dims[2] = {kDim, 8};
  Table* tables[2] = {&narrow, &wide};
  std::vector<int64_t> stored_keys(kStored);
  for (int64_t i = 0; i < kStored; ++i) stored_keys[i] = i * 998244353LL + 11;
  std::shared_mutex rw;
  auto assign_rows = [&] {  // AssignSink: every stored key's row is row_value(key, j)
    for (int p = 0; p < 2; ++p) {
      std::vector<float> rows(kStored * dims[p]);
      for (int64_t i = 0; i < kStored; ++i)
        for (int64_t j = 0; j < dims[p]; ++j) rows[i * dims[p] + j] = row_value(stored_keys[i], j);
      std::vector<int8_t> status(kStored);
      std::vector<int64_t> counts(kStatusCount);
      HeapWorkspace ws;
      AssignSink<float> sink{tables[p]->ref(), uniform_init(), dims[p], rows.data(), dims[p], {}};
      emu::launch_upsert_keys(sink, args_for(ScoreStrategy::kNoEviction, 0), stored_keys.data(),
                              kStored, nullptr, status.data(), counts.data(), ws, nullptr);
      CHECK(counts[static_cast<int>(Status::kFailed)] == 0, "pool: a row not stored");
    }
  };
  assign_rows();
  run_threads(kThreads, [&](int me) {
    for (int round = 0; round < 2; ++round) {
      if (me == 0 && round == 1) {  // a writer between the readers (hits: same slots)
        std::unique_lock<std::shared_mutex> w(rw);
        assign_rows();
      }
      const PoolingMode mode = round % 2 == 0 ? PoolingMode::kSum : PoolingMode::kMean;
      // Bags of 0 .. 6 indices; one key in 5 is not stored (a negative key).
      std::vector<int64_t> keys[2], offsets[2];
      std::vector<float> weights[2];
      const int64_t num_bags[2] = {96, 64};  // part 1: 2 features of 32 bags
      for (int p = 0; p < 2; ++p) {
        offsets[p].push_back(0);
        for (int64_t b = 0; b < num_bags[p]; ++b) {
          const int64_t len = (b * 5 + me + round) % 7;
          for (int64_t k = 0; k < len; ++k) {
            const int64_t x = (b * 31 + k * 17 + me * 13 + round * 7) % (kStored + kStored / 4);
            keys[p].push_back(x < kStored ? stored_keys[x] : -(x * 1000 + 3));  // < 0: absent
            weights[p].push_back(0.25f * static_cast<float>((x + k) % 9) - 0.75f);
          }
          offsets[p].push_back(static_cast<int64_t>(keys[p].size()));
        }
      }
      // Part 1's distinct keys and the id of each index.
      std::vector<int64_t> unique, inverse;
      std::map<int64_t, int64_t> id;
      for (int64_t key : keys[1]) {
        const auto [it, fresh] = id.emplace(key, static_cast<int64_t>(unique.size()));
        if (fresh) unique.push_back(key);
        inverse.push_back(it->second);
      }
      std::vector<float> dense(num_bags[0] * kDim, -1.0f), columns_out(32 * 16, -1.0f);
      const int64_t columns[2] = {0, 8};
      std::shared_lock<std::shared_mutex> r(rw);
      std::vector<int64_t> slots0(keys[0].size()), slots1(unique.size());
      emu::launch_find_slots(narrow.ref(), keys[0].data(), static_cast<int64_t>(keys[0].size()),
                             slots0.data(), nullptr);
      emu::launch_find_slots(wide.ref(), unique.data(), static_cast<int64_t>(unique.size()),
                             slots1.data(), nullptr);
      PoolPart<float> parts[2] = {
          {narrow.ref(), IndexSlots{slots0.data(), nullptr}, keys[0].data(), offsets[0].data(),
           weights[0].data(), missing_init(), dense_bags(dense.data(), kDim), num_bags[0], kDim,
           0},
          {wide.ref(), IndexSlots{slots1.data(), inverse.data()}, keys[1].data(),
           offsets[1].data(), weights[1].data(), missing_init(),
           BagRows<float>{columns_out.data(), 16, columns, 32}, num_bags[1], 8, 0}};
      const PartTotals totals = number_parts(parts, 2);
      emu::launch_pool(Parts<PoolPart<float>>{parts, {}, 2}, totals, mode, nullptr);
      for (int p = 0; p < 2; ++p) {
        for (int64_t b = 0; b < num_bags[p]; ++b) {
          const int64_t begin = offsets[p][b], end = offsets[p][b + 1];
          const float* out = parts[p].out.at(b);
          for (int64_t j = 0; j < dims[p]; ++j) {
            // pooling.h's rule: indices ascending, from zero, one fused multiply-add each
            float sum = 0.0f;
            for (int64_t i = begin; i < end; ++i) {
              const int64_t key = keys[p][i];
              const float v = key >= 0 ? row_value(key, j) : missing_element(missing_init(), key, j);
              sum = std::fmaf(weights[p][i], v, sum);
            }
            if (mode == PoolingMode::kMean && end > begin)
              sum *= 1.0f / static_cast<float>(end - begin);
            CHECK(out[j] == sum, "pool: part %d, bag %lld, element %lld: %g, expected %g", p,
                  static_cast<long long>(b), static_cast<long long>(j), out[j], sum);
          }
        }
      }
    }
  });
}

/// One table's share of a backward batch as the training ops build it: its bags, the
/// distinct keys (first-occurrence order) and each index's key, their slots.
struct BackwardBatch {
  std::vector<int64_t> keys, offsets{0}, unique, inverse, unique_slots;
  std::vector<float> weights;  // empty: none
  int64_t num_bags = 0;

  void end_bag() { offsets.push_back(static_cast<int64_t>(keys.size())), ++num_bags; }
  void number_keys() {
    std::map<int64_t, int64_t> id;
    for (int64_t key : keys) {
      const auto [it, fresh] = id.emplace(key, static_cast<int64_t>(unique.size()));
      if (fresh) unique.push_back(key);
      inverse.push_back(it->second);
    }
  }
};

/// The gradient of distinct key u (dim floats) in core/pooling.h's order: its indices'
/// terms scale * grad_out[bag] ascending, in chunks of kGradientChunk each summed from
/// zero, the chunks' sums added in order to a total from zero.
std::vector<float> reference_gradient(const BackwardBatch& a, const BagRows<const float>& grad,
                                      PoolingMode mode, int64_t u, int64_t dim) {
  std::vector<float> total(dim, 0.0f), chunk(dim, 0.0f);
  int64_t in_chunk = 0;
  for (int64_t b = 0; b < a.num_bags; ++b) {
    const int64_t begin = a.offsets[b], end = a.offsets[b + 1];
    for (int64_t i = begin; i < end; ++i) {
      if (a.inverse[i] != u) continue;
      const float w = a.weights.empty() ? 1.0f : a.weights[i];
      const float scale = mode == PoolingMode::kMean ? w / static_cast<float>(end - begin) : w;
      for (int64_t j = 0; j < dim; ++j) chunk[j] += scale * grad.at(b)[j];
      if (++in_chunk == kGradientChunk) {
        for (int64_t j = 0; j < dim; ++j) total[j] += chunk[j], chunk[j] = 0.0f;
        in_chunk = 0;
      }
    }
  }
  if (in_chunk > 0)
    for (int64_t j = 0; j < dim; ++j) total[j] += chunk[j];
  return total;
}

/// Two host threads each train their own two tables (writers of different tables run
/// together) through launch_backward, one call of both parts a round: part 0 (dim 4, rows
/// of 5 columns) has a hot key with ~2,300 of its ~2,600 indices (36 gradient chunks: the
/// chunked sum), weights, and a key that is not stored (slot -1: skipped); part 1 (dim 8,
/// rows of 9) a key of 102 indices (2 chunks), an empty bag, no weights, and its
/// gradients in the columns of a feature-major matrix. Thread 0: SGD, first with SUM and
/// no weight decay, whose gradients (sums of multiples of 0.5) and rows are exact in any
/// order, so each row is w - lr * g computed here, then MEAN with weight decay; thread 1:
/// EXACT_ROWWISE_ADAGRAD with MEAN then SUM (its state carried). All but the exact round
/// against the gradients summed here in core/pooling.h's order and optimizer_rules.h's
/// update. Every stored row, with its state, must equal the one kept here, bit for bit.
void emulated_backward() {
  run_threads(2, [&](int me) {
    Table narrow(16, 32, false, kDim + 1), wide(16, 32, false, 9);
    Table* tables[2] = {&narrow, &wide};
    const int64_t dims[2] = {kDim, 8};
    constexpr int64_t kStored = 200;
    std::map<int64_t, std::vector<float>> model[2];  // key -> the row it should have
    std::vector<int64_t> stored_keys(kStored);
    for (int64_t i = 0; i < kStored; ++i) stored_keys[i] = key_of(me, i * 7 + 1);
    for (int p = 0; p < 2; ++p) {
      std::vector<float> rows(kStored * dims[p]);
      for (int64_t i = 0; i < kStored; ++i) {
        std::vector<float>& row = model[p][stored_keys[i]];
        row.assign(tables[p]->width, uniform_init().extra_value);
        for (int64_t j = 0; j < dims[p]; ++j)
          rows[i * dims[p] + j] = row[j] = row_value(stored_keys[i], j);
      }
      std::vector<int8_t> status(kStored);
      std::vector<int64_t> counts(kStatusCount);
      HeapWorkspace ws;
      AssignSink<float> sink{tables[p]->ref(), uniform_init(), dims[p], rows.data(), dims[p], {}};
      emu::launch_upsert_keys(sink, args_for(ScoreStrategy::kNoEviction, 0), stored_keys.data(),
                              kStored, nullptr, status.data(), counts.data(), ws, nullptr);
      CHECK(counts[static_cast<int>(Status::kFailed)] == 0, "backward: a row not stored");
    }
    const int64_t hot = stored_keys[0], absent = key_of(me, 999'999), twice = stored_keys[1];
    for (int round = 0; round < 2; ++round) {
      const OptimizerKind kind = me == 0 ? OptimizerKind::kSgd : OptimizerKind::kRowwiseAdagrad;
      const PoolingMode mode = (me + round) % 2 == 0 ? PoolingMode::kSum : PoolingMode::kMean;
      const bool exact = me == 0 && round == 0;  // SGD, SUM, no weight decay
      // FTRL's fields (learning_rate_power, beta, l1, l2) unused by these kinds.
      const OptimizerArgs opt{kind,  0.25f, 1e-8f, 0.9f, 0.999f, exact ? 0.0f : 0.01f,
                              -0.5f, 0.0f,  0.0f,  0.0f, round + 1};
      BackwardBatch batch[2];
      for (int64_t b = 0; b < 48; ++b) {  // part 0: the hot key 7 indices in 8
        for (int64_t k = 0; k < 52 + (b + me) % 5; ++k) {
          const int64_t x = (b * 7 + k + round) % 150 + 1;
          batch[0].keys.push_back(k % 8 != 0 ? hot : x == 77 ? absent : stored_keys[x]);
          batch[0].weights.push_back(0.5f * static_cast<float>(1 + (b + k) % 3));
        }
        batch[0].end_bag();
      }
      for (int64_t b = 0; b < 52; ++b) {  // part 1: `twice` twice a bag, bag 13 empty
        for (int64_t k = 0; b != 13 && k < 2 + (b + round) % 4; ++k)
          batch[1].keys.push_back(k < 2 ? twice : stored_keys[(b * 11 + k * 3 + me) % 190 + 2]);
        batch[1].end_bag();
      }
      CHECK(std::count(batch[0].keys.begin(), batch[0].keys.end(), hot) > 2000,
            "backward: the hot key is not hot");
      CHECK(std::count(batch[1].keys.begin(), batch[1].keys.end(), twice) == 102,
            "backward: part 1's key of two chunks");
      // Gradients: small integers (exact sums); part 1 feature-major, 2 features of 26.
      std::vector<float> grad0(48 * kDim), grad1(26 * 16);
      for (size_t e = 0; e < grad0.size(); ++e) grad0[e] = static_cast<float>((e * 5 + round) % 7) - 3;
      for (size_t e = 0; e < grad1.size(); ++e) grad1[e] = static_cast<float>((e * 3 + me) % 5) - 2;
      const int64_t columns[2] = {0, 8};
      const BagRows<const float> grads[2] = {dense_bags<const float>(grad0.data(), kDim),
                                             BagRows<const float>{grad1.data(), 16, columns, 26}};
      BackwardPart<float> parts[2];
      for (int p = 0; p < 2; ++p) {
        BackwardBatch& a = batch[p];
        a.number_keys();
        a.unique_slots.resize(a.unique.size());
        emu::launch_find_slots(tables[p]->ref(), a.unique.data(),
                               static_cast<int64_t>(a.unique.size()), a.unique_slots.data(),
                               nullptr);
        parts[p] = BackwardPart<float>{tables[p]->ref(),  a.unique_slots.data(),
                                       a.inverse.data(),  a.offsets.data(),
                                       a.weights.empty() ? nullptr : a.weights.data(),
                                       grads[p],          a.num_bags,
                                       static_cast<int64_t>(a.keys.size()),
                                       static_cast<int64_t>(a.unique.size()),
                                       dims[p],           0, 0, 0, 0};
      }
      CHECK(std::count(batch[0].unique_slots.begin(), batch[0].unique_slots.end(), -1) == 1,
            "backward: part 0 has no skipped key");
      // The rows this round should give, computed here before the launch.
      for (int p = 0; p < 2; ++p) {
        const BackwardBatch& a = batch[p];
        for (size_t u = 0; u < a.unique.size(); ++u) {
          if (a.unique_slots[u] < 0) continue;
          const std::vector<float> g =
              reference_gradient(a, grads[p], mode, static_cast<int64_t>(u), dims[p]);
          std::vector<float>& row = model[p].at(a.unique[u]);
          if (exact) {  // g by any order, then w - lr * g
            for (int64_t j = 0; j < dims[p]; ++j) {
              double sum = 0.0;
              for (int64_t b = 0; b < a.num_bags; ++b)
                for (int64_t i = a.offsets[b]; i < a.offsets[b + 1]; ++i)
                  if (a.inverse[i] == static_cast<int64_t>(u))
                    sum += (a.weights.empty() ? 1.0 : a.weights[i]) * grads[p].at(b)[j];
              CHECK(static_cast<double>(g[j]) == sum, "backward: reference gradient");
              row[j] = static_cast<float>(row[j] - 0.25 * sum);
            }
          } else if (kind == OptimizerKind::kSgd) {
            for (int64_t j = 0; j < dims[p]; ++j)
              row[j] = row[j] - opt.learning_rate * (g[j] + opt.weight_decay * row[j]);
          } else {
            update_row(opt, row.data(), dims[p], g.data());
          }
        }
      }
      HeapWorkspace ws;
      const PartTotals totals = number_parts(parts, 2);
      emu::launch_backward(Parts<BackwardPart<float>>{parts, {}, 2}, totals, mode, opt, ws,
                           nullptr);
      for (int p = 0; p < 2; ++p) {
        const Table& t = *tables[p];
        const std::map<int64_t, int64_t> slot_of = t.stored();
        CHECK(slot_of.size() == static_cast<size_t>(kStored), "backward: keys changed");
        for (const auto& [key, row] : model[p]) {
          const float* got = &t.values[slot_of.at(key) * t.width];
          for (int64_t j = 0; j < t.width; ++j)
            CHECK(got[j] == row[j],
                  "backward: round %d, part %d, key %lld%s, column %lld: %g, expected %g", round,
                  p, static_cast<long long>(key), key == hot ? " (hot)" : "",
                  static_cast<long long>(j), got[j], row[j]);
        }
      }
    }
  });
}

}  // namespace dynemb::tsan

namespace dynemb::tsan {

/// 8-bit rows (core/quantized_rows.h): host threads pool their own bags over one shared
/// set of rows in launch_pool_quantized, INT8 and E4M3, SUM and MEAN, with weights,
/// empty bags and indices without a slot; each bag equals core pool_quantized_bag's.
void emulated_pool_quantized() {
  constexpr int64_t kSlots = 200, kDim8 = 16;
  for (const RowFormat format : {RowFormat::kInt8, RowFormat::kE4M3}) {
    const int64_t width = quantized_row_bytes(format, kDim8);
    std::vector<uint8_t> bytes(kSlots * width);
    for (int64_t s = 0; s < kSlots; ++s) {
      uint8_t* row = bytes.data() + s * width;
      for (int64_t j = 0; j < kDim8; ++j) row[j] = static_cast<uint8_t>((s * 37 + j * 11) % 126);
      const float params[2] = {0.01f * static_cast<float>(s + 1), -0.5f};
      std::memcpy(row + kDim8, params, static_cast<size_t>(width - kDim8));
    }
    const QuantizedRows rows{bytes.data(), width, format};
    run_threads(kThreads, [&](int me) {
      for (int round = 0; round < 2; ++round) {
        const PoolingMode mode = round == 0 ? PoolingMode::kSum : PoolingMode::kMean;
        std::vector<int64_t> slots, keys, offsets{0};
        std::vector<float> weights;
        constexpr int64_t kBags = 64;
        for (int64_t b = 0; b < kBags; ++b) {
          for (int64_t k = 0; k < (b + me) % 6; ++k) {
            const int64_t x = (b * 29 + k * 7 + me * 5) % (kSlots + 20);
            slots.push_back(x < kSlots ? x : -1);
            keys.push_back(x);
            weights.push_back(0.5f * static_cast<float>(k) - 1.0f);
          }
          offsets.push_back(static_cast<int64_t>(slots.size()));
        }
        std::vector<float> out(kBags * kDim8, -1.0f), expected(kDim8);
        emu::launch_pool_quantized(rows, slots.data(), keys.data(), offsets.data(),
                                   weights.data(), kBags, mode, missing_init(), out.data(), kDim8,
                                   nullptr);
        for (int64_t b = 0; b < kBags; ++b) {
          pool_quantized_bag(rows, slots.data(), keys.data(), weights.data(), offsets[b],
                             offsets[b + 1], mode, missing_init(), expected.data(), kDim8);
          for (int64_t j = 0; j < kDim8; ++j) {
            CHECK(out[b * kDim8 + j] == expected[j], "pool_quantized: bag %lld, element %lld",
                  static_cast<long long>(b), static_cast<long long>(j));
          }
        }
      }
    });
  }
}

}  // namespace dynemb::tsan
