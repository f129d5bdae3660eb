// CastSQL's deleted positions, tested inside DuckDB's pipeline.
//
// A view over data files with scattered deletes filters its scan with
//   WHERE "castsql/live"(set, file_index, file_row_number)
// where `set` binds each file of the scan (by its index in the file list) to
// a bitmap of that file's deleted positions held here, in memory. Compared
// with an anti-join against a table of positions nothing is hashed or probed:
// a bit is read per row, in parallel. Bitmaps are shared: the views of two
// versions whose deletes of a file are the same bind the same bitmap, so a
// new version costs the bitmaps of the files it changed
// (docs/PERFORMANCE.md, "Deletes applied in the pipeline").
//
//   "castsql/alloc"(bitmap, rows, n) -> BOOLEAN  room for n deleted positions of rows
//   "castsql/mark"(bitmap, i, pos)   -> BOOLEAN  the i-th deleted position (ascending)
//   "castsql/fill"(bitmap, lo, hi)   -> BOOLEAN  positions lo..hi (a bitset's run: whole row groups)
//   "castsql/clone"(bitmap, of, n)   -> BOOLEAN  a copy of bitmap `of`, room for n more
//   "castsql/seal"(bitmap)           -> BOOLEAN  positions marked after a clone, merged in
//   "castsql/bind"(set, file, bitmap) -> BOOLEAN  the set's file reads the bitmap
//   "castsql/live"(set, file, pos)    -> BOOLEAN  false where deleted
//   "castsql/forget"(set)             -> BIGINT   drop a set (its bitmaps stay)
//   "castsql/drop"(bitmap)            -> BOOLEAN  drop a bitmap (sets keep theirs)
//   "castsql/bitmaps"()               -> BIGINT   bitmaps and sets held (for tests)
//
// Only CastSQL calls them: its SQL guard refuses every statement that names
// anything starting with "castsql/". Built by castsql/engine/duckdb/native/build.py
// against DuckDB's stable C extension API (v1.2.0).
#define DUCKDB_EXTENSION_NAME castsql_live
#include "duckdb_extension.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

DUCKDB_EXTENSION_EXTERN

namespace {

// A file's deleted positions: a bitset (a bit read per row), or a sorted
// array where the file is large and its deletes sparse (four bytes per
// deleted row; the bitset would pass 2 MB and be 8x larger). The array form
// costs a cursor walk per row: measured 1.17x the bitset on a full scan.
constexpr int64_t DENSE_ROWS = 1LL << 24; // a bitset of at most 2 MB

struct Bits {
	int64_t rows;
	std::vector<std::atomic<uint64_t>> words; // dense
	std::vector<uint32_t> sorted;             // sparse
	bool dense;
	size_t merged = 0; // sparse: sorted[0, merged) is sorted; the rest, if any, waits for seal()
	Bits(int64_t n, int64_t count) : rows(n), dense(n <= DENSE_ROWS || count * 32 >= n) {
		if (dense) {
			words = std::vector<std::atomic<uint64_t>>(static_cast<size_t>((n + 63) / 64));
			for (auto &w : words) {
				w.store(0, std::memory_order_relaxed);
			}
		} else {
			sorted.resize(static_cast<size_t>(count));
			merged = sorted.size(); // they arrive in order
		}
	}
	// A copy of `o` with room for `extra` more positions (at o's count on).
	Bits(const Bits &o, int64_t extra) : rows(o.rows), dense(o.dense) {
		if (dense) {
			words = std::vector<std::atomic<uint64_t>>(o.words.size());
			for (size_t i = 0; i < words.size(); i++) {
				words[i].store(o.words[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
			}
		} else {
			sorted = o.sorted;
			merged = sorted.size();
			sorted.resize(sorted.size() + static_cast<size_t>(extra));
		}
	}
	void seal() {
		if (!dense && merged < sorted.size()) {
			std::sort(sorted.begin() + merged, sorted.end());
			std::inplace_merge(sorted.begin(), sorted.begin() + merged, sorted.end());
			merged = sorted.size();
		}
	}
	// Positions arrive with their index in the file's sorted list; threads
	// write disjoint slots or set bits atomically.
	// A run of positions, a word at a time (a bitset only).
	bool fill(int64_t lo, int64_t hi) {
		if (!dense || lo < 0 || hi < lo || hi >= rows) {
			return false;
		}
		for (int64_t p = lo; p <= hi;) {
			const int64_t n = std::min<int64_t>(64 - (p & 63), hi - p + 1);
			const uint64_t bits = n == 64 ? ~0ULL : ((1ULL << n) - 1) << (p & 63);
			words[p >> 6].fetch_or(bits, std::memory_order_relaxed);
			p += n;
		}
		return true;
	}
	bool put(int64_t idx, int64_t p) {
		if (p < 0 || p >= rows) {
			return false;
		}
		if (dense) {
			words[p >> 6].fetch_or(1ULL << (p & 63), std::memory_order_relaxed);
			return true;
		}
		if (idx < 0 || idx >= static_cast<int64_t>(sorted.size())) {
			return false;
		}
		sorted[idx] = static_cast<uint32_t>(p);
		return true;
	}
};

// Tests positions of one file, mostly ascending by one (a scan's vector):
// the sparse form walks from where the last row left it.
struct Cursor {
	const Bits *bits = nullptr;
	size_t k = 0;
	int64_t last = -2;
	void reset(const Bits *b) {
		bits = b;
		k = 0;
		last = -2;
	}
	bool deleted(int64_t p) {
		if (p < 0 || p >= bits->rows) {
			return false;
		}
		if (bits->dense) {
			return (bits->words[p >> 6].load(std::memory_order_relaxed) >> (p & 63)) & 1ULL;
		}
		const auto &a = bits->sorted;
		if (p != last + 1) {
			k = std::lower_bound(a.begin(), a.end(), static_cast<uint32_t>(p)) - a.begin();
		} else {
			while (k < a.size() && a[k] < p) {
				k++;
			}
		}
		last = p;
		return k < a.size() && a[k] == p;
	}
};
using Set = std::vector<std::shared_ptr<Bits>>; // by file index; null: no deletes

std::shared_mutex mu;
std::unordered_map<int64_t, std::shared_ptr<Bits>> bitmaps;
std::unordered_map<int64_t, std::shared_ptr<Set>> sets;

std::shared_ptr<Bits> find_bitmap(int64_t id) {
	std::shared_lock<std::shared_mutex> lock(mu);
	auto it = bitmaps.find(id);
	return it == bitmaps.end() ? nullptr : it->second;
}

std::shared_ptr<Set> find_set(int64_t id) {
	std::shared_lock<std::shared_mutex> lock(mu);
	auto it = sets.find(id);
	return it == sets.end() ? nullptr : it->second;
}

template <class T>
T *column(duckdb_data_chunk in, idx_t i) {
	return static_cast<T *>(duckdb_vector_get_data(duckdb_data_chunk_get_vector(in, i)));
}

template <class T>
T *result(duckdb_vector out) {
	return static_cast<T *>(duckdb_vector_get_data(out));
}

// Every argument is a number CastSQL writes itself, never NULL; a NULL would
// read as whatever the vector holds, so it is refused instead. Returns the
// chunk's row count, or 0 (nothing to do) after setting the error.
idx_t checked_rows(duckdb_function_info info, duckdb_data_chunk in) {
	idx_t n = duckdb_data_chunk_get_size(in);
	idx_t columns = duckdb_data_chunk_get_column_count(in);
	for (idx_t c = 0; c < columns; c++) {
		uint64_t *validity = duckdb_vector_get_validity(duckdb_data_chunk_get_vector(in, c));
		if (!validity) {
			continue;
		}
		for (idx_t i = 0; i < n; i++) {
			if (!duckdb_validity_row_is_valid(validity, i)) {
				duckdb_scalar_function_set_error(info, "castsql/live: NULL argument");
				return 0;
			}
		}
	}
	return n;
}

void alloc_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *id = column<int64_t>(in, 0);
	auto *rows = column<int64_t>(in, 1);
	auto *count = column<int64_t>(in, 2);
	std::unique_lock<std::shared_mutex> lock(mu);
	for (idx_t i = 0; i < n; i++) {
		if (rows[i] < 0 || rows[i] > (1LL << 32) || count[i] < 0 || count[i] > rows[i]) {
			duckdb_scalar_function_set_error(info, "castsql/alloc: row or position count out of range");
			return;
		}
		bitmaps[id[i]] = std::make_shared<Bits>(rows[i], count[i]);
		result<bool>(out)[i] = true;
	}
}

void mark_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *id = column<int64_t>(in, 0);
	auto *idx = column<int64_t>(in, 1);
	auto *pos = column<int64_t>(in, 2);
	std::shared_ptr<Bits> bits;
	int64_t last = 0;
	for (idx_t i = 0; i < n; i++) {
		if (!bits || id[i] != last) {
			bits = find_bitmap(id[i]);
			last = id[i];
		}
		if (!bits || !bits->put(idx[i], pos[i])) {
			duckdb_scalar_function_set_error(info, "castsql/mark: no such bitmap, or position out of range");
			return;
		}
		result<bool>(out)[i] = true;
	}
}

void fill_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *id = column<int64_t>(in, 0);
	auto *lo = column<int64_t>(in, 1);
	auto *hi = column<int64_t>(in, 2);
	for (idx_t i = 0; i < n; i++) {
		auto bits = find_bitmap(id[i]);
		if (!bits || !bits->fill(lo[i], hi[i])) {
			duckdb_scalar_function_set_error(info, "castsql/fill: no such bitset, or run out of range");
			return;
		}
		result<bool>(out)[i] = true;
	}
}

void bind_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *set = column<int64_t>(in, 0);
	auto *file = column<uint64_t>(in, 1);
	auto *id = column<int64_t>(in, 2);
	std::unique_lock<std::shared_mutex> lock(mu);
	for (idx_t i = 0; i < n; i++) {
		auto b = bitmaps.find(id[i]);
		if (b == bitmaps.end() || file[i] > (1ULL << 32)) {
			duckdb_scalar_function_set_error(info, "castsql/bind: no such bitmap, or file index out of range");
			return;
		}
		auto &s = sets[set[i]];
		if (!s) {
			s = std::make_shared<Set>();
		}
		if (s->size() <= file[i]) {
			s->resize(file[i] + 1);
		}
		(*s)[file[i]] = b->second;
		result<bool>(out)[i] = true;
	}
}

void live_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *set = column<int64_t>(in, 0);
	auto *file = column<uint64_t>(in, 1);
	auto *pos = column<int64_t>(in, 2);
	auto *res = result<bool>(out);
	std::shared_ptr<Set> s;
	int64_t last_set = 0;
	uint64_t last_file = 0;
	bool any = false;
	Cursor cursor;
	for (idx_t i = 0; i < n; i++) {
		if (!s || set[i] != last_set) {
			s = find_set(set[i]);
			last_set = set[i];
			any = false;
			if (!s) {
				duckdb_scalar_function_set_error(info, "castsql/live: no such set");
				return;
			}
		}
		if (!any || file[i] != last_file) {
			// A file the set binds no bitmap to has no deletes in this view.
			cursor.reset(file[i] < s->size() ? (*s)[file[i]].get() : nullptr);
			last_file = file[i];
			any = true;
		}
		res[i] = !cursor.bits || !cursor.deleted(pos[i]);
	}
}

void clone_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *id = column<int64_t>(in, 0);
	auto *from = column<int64_t>(in, 1);
	auto *extra = column<int64_t>(in, 2);
	std::unique_lock<std::shared_mutex> lock(mu);
	for (idx_t i = 0; i < n; i++) {
		auto o = bitmaps.find(from[i]);
		if (o == bitmaps.end() || extra[i] < 0 || extra[i] > o->second->rows) {
			duckdb_scalar_function_set_error(info, "castsql/clone: no such bitmap, or count out of range");
			return;
		}
		bitmaps[id[i]] = std::make_shared<Bits>(*o->second, extra[i]);
		result<bool>(out)[i] = true;
	}
}

void seal_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *id = column<int64_t>(in, 0);
	std::unique_lock<std::shared_mutex> lock(mu);
	for (idx_t i = 0; i < n; i++) {
		auto b = bitmaps.find(id[i]);
		if (b == bitmaps.end()) {
			duckdb_scalar_function_set_error(info, "castsql/seal: no such bitmap");
			return;
		}
		b->second->seal();
		result<bool>(out)[i] = true;
	}
}

void forget_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *set = column<int64_t>(in, 0);
	std::unique_lock<std::shared_mutex> lock(mu);
	for (idx_t i = 0; i < n; i++) {
		result<int64_t>(out)[i] = static_cast<int64_t>(sets.erase(set[i]));
	}
}

void drop_fn(duckdb_function_info info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = checked_rows(info, in);
	auto *id = column<int64_t>(in, 0);
	std::unique_lock<std::shared_mutex> lock(mu);
	for (idx_t i = 0; i < n; i++) {
		result<bool>(out)[i] = bitmaps.erase(id[i]) > 0;
	}
}

void count_fn(duckdb_function_info, duckdb_data_chunk in, duckdb_vector out) {
	idx_t n = duckdb_data_chunk_get_size(in);
	std::shared_lock<std::shared_mutex> lock(mu);
	for (idx_t i = 0; i < n; i++) {
		result<int64_t>(out)[i] = static_cast<int64_t>(bitmaps.size() + sets.size());
	}
}

bool add(duckdb_connection con, const char *name, std::vector<duckdb_type> params, duckdb_type ret,
         duckdb_scalar_function_t fn) {
	duckdb_scalar_function f = duckdb_create_scalar_function();
	duckdb_scalar_function_set_name(f, name);
	for (auto t : params) {
		duckdb_logical_type type = duckdb_create_logical_type(t);
		duckdb_scalar_function_add_parameter(f, type);
		duckdb_destroy_logical_type(&type);
	}
	duckdb_logical_type r = duckdb_create_logical_type(ret);
	duckdb_scalar_function_set_return_type(f, r);
	duckdb_destroy_logical_type(&r);
	duckdb_scalar_function_set_function(f, fn);
	// Results depend on state outside the arguments: never folded or cached.
	duckdb_scalar_function_set_volatile(f);
	bool ok = duckdb_register_scalar_function(con, f) == DuckDBSuccess;
	duckdb_destroy_scalar_function(&f);
	return ok;
}

} // namespace

// The same bitmaps, applied inside DuckDB's Parquet reader by castsql_scan.cpp
// (a C++ extension linked against this library): a plain C interface, so the
// two need not share a C++ ABI or DuckDB's headers.
#define CASTSQL_EXPORT extern "C" __attribute__((visibility("default")))

// 0 when `set` does not exist; else 1, with *out a handle to the file's bitmap
// (nullptr: the file has no deletes in the set). Handles keep their bitmap
// alive through a later forget or drop, until released.
CASTSQL_EXPORT int castsql_live_acquire(int64_t set, uint64_t file, void **out) {
	*out = nullptr;
	auto s = find_set(set);
	if (!s) {
		return 0;
	}
	if (file < s->size() && (*s)[file]) {
		*out = new std::shared_ptr<Bits>((*s)[file]);
	}
	return 1;
}

CASTSQL_EXPORT void castsql_live_release(void *handle) {
	delete static_cast<std::shared_ptr<Bits> *>(handle);
}

// The rows of [start, start + count) that are not deleted: their offsets from
// `start`, ascending, written to `keep` (room for `count`) unless it is null.
// Returns how many; the caller asks with a null `keep` first, as most vectors
// of a scan with scattered deletes still lose a row or two, and none of the
// vectors between a row group's deletes need a selection at all.
CASTSQL_EXPORT uint64_t castsql_live_select(const void *handle, int64_t start, uint64_t count, uint32_t *keep) {
	const Bits &b = **static_cast<const std::shared_ptr<Bits> *>(handle);
	const int64_t end = std::min<int64_t>(start + static_cast<int64_t>(count), b.rows);
	uint64_t kept = count;
	if (b.dense) {
		// Whole words at a time; the rows past the file's end are live.
		int64_t p = std::max<int64_t>(start, 0);
		if (!keep) {
			while (p < end) {
				const int64_t n = std::min<int64_t>(64 - (p & 63), end - p);
				uint64_t w = b.words[p >> 6].load(std::memory_order_relaxed) >> (p & 63);
				if (n < 64) {
					w &= (1ULL << n) - 1;
				}
				kept -= static_cast<uint64_t>(__builtin_popcountll(w));
				p += n;
			}
			return kept;
		}
		kept = 0;
		for (uint64_t i = 0; i < count; i++) {
			const int64_t q = start + static_cast<int64_t>(i);
			if (q < 0 || q >= b.rows || !((b.words[q >> 6].load(std::memory_order_relaxed) >> (q & 63)) & 1ULL)) {
				keep[kept++] = static_cast<uint32_t>(i);
			}
		}
		return kept;
	}
	const auto &a = b.sorted;
	auto it = std::lower_bound(a.begin(), a.end(), static_cast<uint32_t>(std::max<int64_t>(start, 0)));
	if (!keep) {
		auto last = std::lower_bound(it, a.end(), static_cast<uint32_t>(std::max<int64_t>(end, 0)));
		return count - static_cast<uint64_t>(last - it);
	}
	kept = 0;
	for (uint64_t i = 0; i < count; i++) {
		const int64_t q = start + static_cast<int64_t>(i);
		if (it != a.end() && static_cast<int64_t>(*it) == q) {
			++it;
			continue;
		}
		keep[kept++] = static_cast<uint32_t>(i);
	}
	return kept;
}

DUCKDB_EXTENSION_ENTRYPOINT(duckdb_connection con, duckdb_extension_info info, struct duckdb_extension_access *access) {
	const auto I = DUCKDB_TYPE_BIGINT, U = DUCKDB_TYPE_UBIGINT, B = DUCKDB_TYPE_BOOLEAN;
	return add(con, "castsql/alloc", {I, I, I}, B, alloc_fn) && add(con, "castsql/mark", {I, I, I}, B, mark_fn) &&
	       add(con, "castsql/bind", {I, U, I}, B, bind_fn) && add(con, "castsql/live", {I, U, I}, B, live_fn) &&
	       add(con, "castsql/forget", {I}, I, forget_fn) && add(con, "castsql/drop", {I}, B, drop_fn) &&
	       add(con, "castsql/clone", {I, I, I}, B, clone_fn) && add(con, "castsql/seal", {I}, B, seal_fn) &&
	       add(con, "castsql/fill", {I, I, I}, B, fill_fn) &&
	       add(con, "castsql/bitmaps", {}, I, count_fn);
}
