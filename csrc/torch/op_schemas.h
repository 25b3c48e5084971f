// dynemb torch layer: the schemas of the table and embedding ops, written once.
// Defined for the op library `dynemb` (ops.cpp: CPU and CUDA registrations) and for
// `dynemb_cuda_emulated` (csrc/emulated/ops_emulated.cpp).
//
// Conventions: `table` is the Tensor[] described in tensor_checks.h;
// policy = [score_strategy, batch_value, seed, evict_below, dim, pin, pin_floor, half_life,
//           decay_step] (the last two may be left out of a single table's policy)
// (evict_below: a full bucket evicts only a resident scored below it; -1 = any, 0 =
// never; pin: written to every slot the batch finds or claims; pin_floor: residents
// pinned at or above it are not evicted, core/table_ops.h "Pins");
// init = [mode, a, b, lower, upper, extra_value, column_offset, extra_zeros] (see
// core/initializer.h);
// evicted = [] or [keys (n) int64, rows (n, row_width), scores (n) int64].
// Table ops: table_op_impls.h; training lookups by slot: slot_op_impls.h; embedding ops:
// embedding_op_impls.h.
#pragma once

#include <torch/library.h>

// clang-format off
#define DYNEMB_DEFINE_OPS(m)                                                                          \
  do {                                                                                                \
  (m).def("hash_keys(Tensor keys, int num_buckets) -> (Tensor bucket, Tensor digest)");               \
  /* core/score_policy.h score_for_hit per element: a cache tier's scores of the rows it holds. */  \
  (m).def("scores_after_hit(Tensor scores, int strategy, int batch_value, Tensor? accesses, "      \
          "Tensor? custom, int half_life=0, int decay_step=0) -> Tensor");                          \
  (m).def("table_find(Tensor[] table, Tensor keys, Tensor(a!) values) -> Tensor found");              \
  (m).def("table_find_slots(Tensor[] table, Tensor keys) -> Tensor slots");                           \
  (m).def(                                                                                            \
      "table_find_or_insert(Tensor(a!)[] table, int[] policy, float[] init, Tensor keys, "            \
      "Tensor? scores, Tensor(b!) values, Tensor(c!)[] evicted) -> (Tensor status, Tensor counts)");  \
  (m).def(                                                                                            \
      "table_insert_or_assign(Tensor(a!)[] table, int[] policy, float[] init, Tensor keys, "          \
      "Tensor? scores, Tensor values, Tensor(c!)[] evicted) -> (Tensor status, Tensor counts)");      \
  /* Writes saved entries exactly (rows, optimizer state, scores, timestamps): a */                   \
  /* checkpoint load. values (n, dim); state (n, row_width - dim) or None. */                         \
  (m).def(                                                                                            \
      "table_restore(Tensor(a!)[] table, int[] policy, float[] init, Tensor keys, Tensor values, "    \
      "Tensor? state, Tensor? scores, Tensor? timestamps, Tensor(c!)[] evicted) "                     \
      "-> (Tensor status, Tensor counts)");                                                           \
  (m).def("table_erase(Tensor(a!)[] table, Tensor keys) -> Tensor erased");                           \
  (m).def("table_rehash(Tensor[] src, Tensor(a!)[] dst, int window) -> int");                         \
  /* Embedding kernels (csrc/core/pooling.h, optimizer_rules.h). */                                   \
  /* missing = init list of the rows given to keys that are not stored; */                            \
  /* optimizer: op_lists.h op_list::Optimizer. */                                                     \
  /* live: (1) int64 on the keys' device, the number of keys looked up (the first; */                 \
  /* a padded batch): slots and status past them are not written, counts omit them. */               \
  (m).def(                                                                                            \
      "table_find_or_insert_slots(Tensor(a!)[] table, int[] policy, float[] init, Tensor keys, "      \
      "Tensor? scores, Tensor? accesses, bool init_rows=True, Tensor(b!)? evicted_keys=None, "        \
      "Tensor? live=None) -> (Tensor slots, Tensor status, Tensor counts)");                          \
  /* table_find_or_insert_slots of every table of a batch (init_rows, no evicted keys): */          \
  /* table t's lists at [t * size, t * size + size) of tables, policies, inits (op_lists.h); */       \
  /* accesses: none or one per table; counts (T, 4). distinct_keys: the caller's promise */          \
  /* that each table's keys are pairwise distinct (core/table_ops.h UpsertArgs::distinct). */         \
  (m).def(                                                                                            \
      "table_find_or_insert_slots_grouped(Tensor(a!)[] tables, int[] policies, float[] inits, "       \
      "Tensor[] keys, Tensor[] accesses, bool distinct_keys=False) "                                  \
      "-> (Tensor[] slots, Tensor[] status, Tensor counts)");                                         \
  /* A cache fill's row moves (core/tier_ops.h), after its slot claim (keys, slots, */                \
  /* status, evicted_keys: the claim's): for each key that took a slot, the resident */               \
  /* its claim evicted (status EVICTED: evicted_keys[i]) leaves with its row and user */              \
  /* scores (user_scores (slots), or (slots, 2) of score and timestamp where */                       \
  /* `slow` keeps timestamps), then the key's entry of `slow` (or its initial */                      \
  /* row, init = the table's) fills the slot. moved, victims: the claim's counts */                   \
  /* of those keys and of their */                                                                    \
  /* victims (-1: the op counts them; a CUDA executor then reads the device). */                      \
  /* -> (victim_keys, victim_rows, victim_scores, found). */                                          \
  (m).def(                                                                                            \
      "table_cache_exchange(Tensor(a!)[] cache, Tensor[] slow, float[] init, int seed, int dim, "     \
      "Tensor(b!) user_scores, Tensor keys, Tensor slots, Tensor status, Tensor evicted_keys, "       \
      "int moved=-1, int victims=-1) "                                                                \
      "-> (Tensor victim_keys, Tensor victim_rows, Tensor victim_scores, Tensor found)");             \
  (m).def("unique_keys(Tensor keys) -> (Tensor unique, Tensor inverse, Tensor counts)");              \
  (m).def("unique_keys_grouped(Tensor[] keys) -> (Tensor[] unique, Tensor[] inverse, "               \
          "Tensor[] counts)");                                                                        \
  /* unique_keys_grouped without reading the counts: unique[t] and counts[t] have */                  \
  /* keys[t]'s length, their first num_unique[t] entries (on the device) are the result. */           \
  (m).def("unique_keys_grouped_padded(Tensor[] keys) -> (Tensor[] unique, Tensor[] inverse, "        \
          "Tensor[] counts, Tensor num_unique)");                                                     \
  (m).def(                                                                                            \
      "embedding_pool(Tensor[] table, Tensor slots, Tensor keys, Tensor offsets, Tensor? weights, "   \
      "int mode, float[] missing, int seed, int dim) -> Tensor");                                     \
  (m).def(                                                                                            \
      "embedding_pool_into(Tensor[] table, Tensor slots, Tensor keys, Tensor offsets, "               \
      "Tensor? weights, int mode, float[] missing, int seed, int dim, Tensor(b!) out, "               \
      "Tensor columns) -> ()");                                                                       \
  /* embedding_pool_into of every table of a batch in one executor call: table t is */                \
  /* tables[t * 9 ..) and missing[t * 7 ..) (op_lists.h); weights: none or one per table; */        \
  /* inverse: none (slots per index) or one per table (slots per distinct key). */                   \
  (m).def(                                                                                            \
      "embedding_pool_into_grouped(Tensor[] tables, Tensor[] slots, Tensor[] inverse, "               \
      "Tensor[] keys, Tensor[] offsets, Tensor[] weights, int mode, float[] missing, int[] seeds, "   \
      "int[] dims, Tensor(b!) out, Tensor[] columns) -> ()");                                         \
  (m).def(                                                                                            \
      "embedding_gather(Tensor[] table, Tensor slots, Tensor keys, float[] missing, int seed, "       \
      "int dim) -> Tensor");                                                                          \
  /* Lookups of 8-bit rows (csrc/core/quantized_rows.h): `rows` (num_slots, row_bytes) */          \
  /* uint8, the row of each slot of `table`; format: 0 INT8, 1 E4M3. */                               \
  (m).def(                                                                                            \
      "embedding_pool_quantized(Tensor[] table, Tensor rows, int format, Tensor slots, Tensor keys, "  \
      "Tensor offsets, Tensor? weights, int mode, float[] missing, int seed, int dim) -> Tensor");    \
  (m).def(                                                                                            \
      "embedding_gather_quantized(Tensor[] table, Tensor rows, int format, Tensor slots, "            \
      "Tensor keys, float[] missing, int seed, int dim) -> Tensor");                                  \
  (m).def(                                                                                            \
      "embedding_backward(Tensor(a!)[] table, Tensor unique_slots, Tensor inverse, Tensor offsets, "  \
      "Tensor? weights, int mode, Tensor grad, float[] optimizer, int step, int dim, "                \
      "Tensor? columns=None) -> ()");                                                                 \
  /* embedding_backward(columns=) of every (distinct) table of a batch in one executor call. */       \
  (m).def(                                                                                            \
      "embedding_backward_grouped(Tensor(a!)[] tables, Tensor[] unique_slots, Tensor[] inverse, "     \
      "Tensor[] offsets, Tensor[] weights, int mode, Tensor grad, float[] optimizer, int step, "       \
      "int[] dims, Tensor[] columns) -> ()");                                                         \
  } while (0)
// clang-format on
