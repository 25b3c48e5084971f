// ThreadSanitizer driver for the table algorithm (`make sanitize-tsan`).
//
// TSan cannot run inside Python + torch (uninstrumented OpenMP and allocator), so this
// torch-free program runs csrc/core's algorithm concurrently the way the executors do,
// and checks the outcome against what each thread stored:
//   cpu        the core's ops as the CPU executor runs them, from std::threads: upserts
//              and erases by the batch rule's passes, pass 1 partitioned by home-bucket
//              range, pass 2 on one thread (as executor_cpu.cpp and entry_moves_cpu.cpp
//              run them), on tables that spill and that evict; finds after a barrier;
//              one dedup set (CpuPlatform's atomics) filled by all.
//   emulated   the csrc/cuda launchers built for the host (csrc/emulated), whose grids run
//              on a pool of OS threads: upsert / find / erase / rehash / dedup from several
//              host threads under a reader-writer lock (dynemb/table/rw_lock.py's rule);
//              restore (RestoreSink: saved scores over an evicting table's claims, every
//              key its own score); and, each host thread on tables of its own (writers of different tables
//              run together) or as readers under the shared lock:
//                upsert_grouped  launch_upsert_grouped, 3 parts a call (an evicting table
//                                given ~2x more distinct keys than it holds, and repeats:
//                                in-batch eviction under pins; an empty part; a NO_EVICTION
//                                table that spills): every status, slot, pin, row and count
//                                as the table before the batch implies.
//                pool            launch_pool, SUM and MEAN with per-sample weights, 2 parts
//                                (slots per index / per distinct key, dense / feature-major
//                                output, absent keys, empty bags) beside a writer: every bag
//                                equals the sum computed on the host.
//                pool_quantized  launch_pool_quantized over shared 8-bit rows (INT8, E4M3):
//                                every bag equals core pool_quantized_bag's.
//                backward        launch_backward, 2 parts (a hot key of ~2,300 indices, a
//                                key of 2 gradient chunks, a skipped key, an empty bag),
//                                SGD and EXACT_ROWWISE_ADAGRAD, SUM and MEAN: every row and
//                                its state, bit for bit, as computed on the host (SGD + SUM
//                                exactly, in any order).
// Arguments: the names of the cases to run (all when none).
// Exit status 0 when every check holds; TSan itself exits 66 on a report (halt_on_error).
// The cases live in tsan_cpu.cpp, tsan_emulated_tables.cpp and tsan_emulated_embedding.cpp.
#include "tsan_common.h"

using namespace dynemb::tsan;

int main(int argc, char** argv) {
  const std::pair<const char*, void (*)()> cases[] = {
      {"cpu_partitioned_upsert_erase_find", cpu_partitioned_upsert_erase_find},
      {"cpu_partitioned_evicting", cpu_partitioned_evicting},
      {"cpu_dedup_shared_set", cpu_dedup_shared_set},
      {"emulated_upsert_find_erase_rehash", emulated_upsert_find_erase_rehash},
      {"emulated_restore", emulated_restore},
      {"emulated_dedup", emulated_dedup},
      {"emulated_upsert_grouped", emulated_upsert_grouped},
      {"emulated_pool", emulated_pool},
      {"emulated_pool_quantized", emulated_pool_quantized},
      {"emulated_backward", emulated_backward},
  };
  for (const auto& [name, run] : cases) {
    // Arguments: the cases to run (all when none).
    if (argc > 1 && std::none_of(argv + 1, argv + argc,
                                 [&](const char* a) { return std::string(a) == name; }))
      continue;
    run();
    std::printf("tsan_tables: %s ok\n", name);
    std::fflush(stdout);  // TSan ends the process with _exit on a report
  }
  return 0;
}
