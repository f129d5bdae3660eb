// CastSQL's deleted positions, skipped inside DuckDB's Parquet reader.
//
//   "castsql/parquet"(files, castsql_set := set, ...)
//
// is read_parquet with one more option: `set` names the bitmaps castsql_live
// bound to the files (by their index in `files`), and each file's reader gets
// a DeleteFilter that drops those rows before any column is decoded. This is
// how DuckDB's DuckLake, Iceberg and Delta scans apply deletes: nothing is
// projected, hashed or probed, and the Parquet reader decodes only the live
// rows of a vector (docs/PERFORMANCE.md, "Deletes applied in the pipeline").
//
// It is written against DuckDB's C++ API, which is not stable across DuckDB
// versions: build.py builds it for the installed DuckDB only, links it to that
// DuckDB's Python module (which holds the symbols), and CastSQL falls back to
// castsql_live's "castsql/live" filter wherever it did not build or load.
// The bitmaps stay in castsql_live (this library links to it): one copy, one
// owner, whichever of the two reads them.
#include "duckdb.hpp"
#include "duckdb/catalog/catalog_entry/table_function_catalog_entry.hpp"
#include "duckdb/common/multi_file/base_file_reader.hpp"
#include "duckdb/common/multi_file/multi_file_data.hpp"
#include "duckdb/common/multi_file/multi_file_reader.hpp"
#include "duckdb/function/table_function.hpp"
#include "duckdb/main/extension/extension_loader.hpp"

#include <cstdint>

extern "C" {
int castsql_live_acquire(int64_t set, uint64_t file, void **out);
void castsql_live_release(void *handle);
uint64_t castsql_live_select(const void *handle, int64_t start, uint64_t count, uint32_t *keep);
}

namespace {

using namespace duckdb;

constexpr const char *SET_OPTION = "castsql_set";

// One file's deletes, shared by the threads that scan its row groups.
class Deleted : public DeleteFilter {
public:
	explicit Deleted(void *handle) : handle(handle) {
	}
	~Deleted() override {
		castsql_live_release(handle);
	}
	idx_t Filter(row_t start, idx_t count, SelectionVector &sel) override {
		// Counted first: a vector that loses no row keeps the reader's plain
		// decode path (a selection equal to the vector would still be applied).
		idx_t kept = castsql_live_select(handle, start, count, nullptr);
		if (kept == count) {
			return count;
		}
		sel.Initialize(STANDARD_VECTOR_SIZE);
		return castsql_live_select(handle, start, count, sel.data());
	}

private:
	void *handle;
};

struct Reader : public MultiFileReader {
	int64_t set = 0;
	bool has_set = false;

	static unique_ptr<MultiFileReader> Create(const TableFunction &) {
		return make_uniq<Reader>();
	}
	bool ParseOption(const string &key, const Value &val, MultiFileOptions &options, ClientContext &context) override {
		if (key == SET_OPTION) {
			set = val.GetValue<int64_t>();
			has_set = true;
			return true;
		}
		return MultiFileReader::ParseOption(key, val, options, context);
	}
	unique_ptr<MultiFileReader> Copy() const override {
		auto copy = make_uniq<Reader>();
		copy->function_name = function_name;
		copy->set = set;
		copy->has_set = has_set;
		return std::move(copy);
	}
	ReaderInitializeType InitializeReader(MultiFileReaderData &data, const MultiFileBindData &bind,
	                                      const vector<MultiFileColumnDefinition> &columns,
	                                      const vector<ColumnIndex> &column_ids, optional_ptr<TableFilterSet> filters,
	                                      ClientContext &context, MultiFileGlobalState &state) override {
		auto result = MultiFileReader::InitializeReader(data, bind, columns, column_ids, filters, context, state);
		if (!has_set) {
			throw InvalidInputException("castsql/parquet: no castsql_set given");
		}
		auto &reader = *data.reader;
		if (!reader.file_list_idx.IsValid()) {
			throw InternalException("castsql/parquet: a file without its index in the list");
		}
		void *handle = nullptr;
		if (!castsql_live_acquire(set, reader.file_list_idx.GetIndex(), &handle)) {
			throw InvalidInputException("castsql/parquet: no such set");
		}
		if (handle) {
			reader.deletion_filter = make_uniq<Deleted>(handle);
		}
		return result;
	}
};

} // namespace

extern "C" {
DUCKDB_CPP_EXTENSION_ENTRY(castsql_scan, loader) {
	auto &parquet = loader.GetTableFunction("read_parquet");
	TableFunctionSet set("castsql/parquet");
	for (auto &f : parquet.functions.functions) {
		TableFunction scan = f;
		scan.name = "castsql/parquet";
		scan.get_multi_file_reader = Reader::Create;
		scan.named_parameters[SET_OPTION] = LogicalType::BIGINT;
		// read_parquet answers count(*) from its footers' row counts, which
		// count the deleted rows too.
		scan.get_partition_stats = nullptr;
		set.AddFunction(std::move(scan));
	}
	loader.RegisterFunction(std::move(set));
}
}
