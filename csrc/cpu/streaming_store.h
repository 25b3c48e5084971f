// dynemb CPU executor: how batch loops write rows they will not read again
// (non-temporal stores), and which outputs are large enough for it.
#pragma once

#include <cstdint>

#include "core/batch_sinks.h"
#include "core/initializer.h"
#include "cpu/cpu_platform.h"

namespace dynemb::cpu {

/// Writes rows into a caller's output with non-temporal stores: they skip the read
/// for ownership of each output line (4 of the ~10 lines a find+gather key moves)
/// and leave the table's lines in the cache. Rows that are not whole 16-byte
/// chunks at 16-byte boundaries get plain stores. A loop that used it ends with
/// CpuPlatform::store_fence().
///
/// Table rows written whole go the same way where they are whole lines
/// (streams_new_rows): a new key's initial row (staged on the stack, then streamed
/// to the table and the output) and an assigned row. Reading their 4+ lines first
/// (prefetching them, or the read for ownership of a plain store) would be wasted;
/// the loop prefetches no such row (W-table 1 thread: find_or_insert ~+7%,
/// insert_or_assign ~+15%). Only batches whose output is streamed do it: a small
/// batch's rows stay cached for the caller's next op.
struct StreamingStore {
  /// Largest row staged on the stack to be streamed into the table.
  static constexpr int64_t kStagedRowBytes = 4096;

  template <class V>
  static void row(const V* src, V* dst, int64_t n) {
    copy<16>(src, dst, n);
  }

  /// Writes a caller's row (n columns) into a table row: streamed where it is whole
  /// lines, so that an assignment never reads the row it overwrites.
  template <class V>
  static void table_row(const V* src, V* dst, int64_t n) {
    copy<64>(src, dst, n);
  }

  /// Streams n columns where dst and their bytes are multiples of kAlign, else copies.
  template <int64_t kAlign, class V>
  static void copy(const V* src, V* dst, int64_t n) {
    const int64_t bytes = n * static_cast<int64_t>(sizeof(V));
    if ((reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(bytes)) % kAlign != 0) {
      copy_row(src, dst, n);
    } else {
      CpuPlatform::stream_copy(dst, src, bytes);
    }
  }

  /// True when every table row of t is whole cache lines that new_row streams.
  template <class V>
  static bool streams_new_rows(const TableRef<V>& t) {
    const int64_t bytes = t.row_width * static_cast<int64_t>(sizeof(V));
    const uintptr_t bits = reinterpret_cast<uintptr_t>(t.values) |
                           reinterpret_cast<uintptr_t>(t.slow_values) |
                           static_cast<uintptr_t>(bytes);
    return bits % 64 == 0 && bytes <= kStagedRowBytes;
  }

  template <class V>
  static void new_row(const InitArgs& init, int64_t key, int64_t dim, V* table_row,
                      int64_t row_width, V* out, int64_t out_width) {
    const int64_t bytes = row_width * static_cast<int64_t>(sizeof(V));
    if ((reinterpret_cast<uintptr_t>(table_row) | static_cast<uintptr_t>(bytes)) % 64 != 0 ||
        bytes > kStagedRowBytes) {
      init_row(init, key, table_row, dim, row_width);
      row(table_row, out, out_width);
      return;
    }
    alignas(64) unsigned char staged_bytes[kStagedRowBytes];
    V* staged = reinterpret_cast<V*>(staged_bytes);
    init_row(init, key, staged, dim, row_width);
    CpuPlatform::stream_copy(table_row, staged, bytes);
    row(staged, out, out_width);
  }
};

/// Outputs larger than this are written with StreamingStore: their lines would
/// leave the cache before anyone reads them, so fetching them first is wasted;
/// smaller outputs stay cached for the caller's next op. It is the last-level
/// cache of one core complex of current server CPUs (32 MiB; sysconf's figure can
/// be a whole package's, 384 MiB on our VMs, where no thread sees that much).
constexpr int64_t kStreamedOutputBytes = int64_t{32} << 20;

inline bool streams_output(int64_t bytes) { return bytes > kStreamedOutputBytes; }

}  // namespace dynemb::cpu
